# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 03-memcheck.sh: compute-sanitizer memcheck on device_check
sanitize memcheck 90
