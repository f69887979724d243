from anyrtd.cli import main

main(prog_name="anyrtd")
