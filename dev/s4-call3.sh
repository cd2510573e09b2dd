#!/usr/bin/env bash
# Session 4, call 3: re-read call 2's ncu reports (carried in .ncu/) into a file (call 2 printed to
# stdout only and its head was cut off).
set -uo pipefail
cd "$(dirname "$0")/.."
for r in .ncu/*.ncu-rep; do
  echo "=== $r"
  timeout 60 ncu --import $r --page details --print-units base 2>&1 | grep -vE "^ *-+ *$|^ *$" | head -250
done > $OUT/ncu-details.txt 2>&1
for r in .ncu/*.ncu-rep; do
  timeout 60 ncu --import $r --page raw --csv > $OUT/$(basename $r .ncu-rep)-raw.csv 2>/dev/null
done
ls -la $OUT
