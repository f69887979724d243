# What the tests need beyond the clone and Python, sourced by .ci/run: Debian's chromium and
# chromium-driver (the status page's browser tests), faketime (the clock-step tests) and
# promtool (the alerting rules' checks). As root with apt-get (as CI runs), a missing one is
# installed; as another user it is not, and the tests that need it are skipped, with one
# line each that says why, while everything else runs.
#
# Sets ANYRTD_NO_BROWSER, ANYRTD_NO_FAKETIME and ANYRTD_NO_PROMTOOL to the reason when that
# part is skipped (the tests read the first two); unset otherwise.

can_install() { [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; }

skip_line() { echo "skip: $1: $2" >&2; }

who=$(id -un 2>/dev/null || id -u)
unset ANYRTD_NO_BROWSER ANYRTD_NO_FAKETIME ANYRTD_NO_PROMTOOL

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if can_install; then
    (apt-get update -q && apt-get install -y -q chromium chromium-driver) >/dev/null
  else
    export ANYRTD_NO_BROWSER="chromium or chromedriver is missing and $who cannot install them (as root: apt-get install chromium chromium-driver)"
    skip_line "the status page's browser tests (tests/test_status_page*.py)" "$ANYRTD_NO_BROWSER"
  fi
fi

faketime_libs=${ANYRTD_FAKETIME_LIBS:-/usr/lib/*/faketime/libfaketimeMT.so.1}
# shellcheck disable=SC2086 # the glob is meant to expand
if ! ls $faketime_libs >/dev/null 2>&1; then
  if can_install; then
    (apt-get update -q && apt-get install -y -q faketime) >/dev/null
  else
    export ANYRTD_NO_FAKETIME="libfaketime is missing and $who cannot install it (as root: apt-get install faketime)"
    skip_line "the clock-step tests (tests/test_faults_clock.py, tests/test_timer_sleep.py)" "$ANYRTD_NO_FAKETIME"
  fi
fi

if ! command -v promtool >/dev/null 2>&1 && ! can_install; then
  export ANYRTD_NO_PROMTOOL="promtool is missing and $who cannot install it (as root: apt-get install prometheus)"
  skip_line "the alerting rules' checks (.ci/promtool-checks)" "$ANYRTD_NO_PROMTOOL"
fi
