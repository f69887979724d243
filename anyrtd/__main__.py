from anyrtd.cli import main

main()
