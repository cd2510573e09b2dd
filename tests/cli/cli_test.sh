#!/usr/bin/env bash
# tests/cli/cli_test.sh MOEKIT — the command line's checks, run without a GPU (ctest cli.*): bad
# flags and layers fail before any device is asked for, with the exit code of exit_codes.hpp and a
# short message naming the flag; --help documents the exit codes; `check` without a GPU fails.
set -uo pipefail
MOEKIT=${1:?usage: cli_test.sh path/to/moekit}
fails=0

# expect RC PATTERN ARGS...: exit code RC, and stdout+stderr matching PATTERN (grep -E), under
# 400 characters a line (no 300-digit ranges), never asking for a GPU first.
expect() {
  local want=$1 pattern=$2
  shift 2
  local out rc
  out=$("$MOEKIT" "$@" 2>&1)
  rc=$?
  local why=""
  [ "$rc" = "$want" ] || why="exit code $rc, expected $want"
  grep -qE -- "$pattern" <<<"$out" || why="$why; output does not match /$pattern/"
  if awk 'length > 400 { exit 1 }' <<<"$out"; then :; else why="$why; a line over 400 characters"; fi
  if [ "$want" = 3 ] && grep -q "needs an NVIDIA Hopper GPU" <<<"$out"; then why="$why; asked for a GPU first"; fi
  if [ -n "$why" ]; then
    echo "FAIL: moekit $*: ${why#; }"
    sed 's/^/    /' <<<"$out" | head -5
    fails=$((fails + 1))
  else
    echo "ok:   moekit $* -> $rc"
  fi
}

# Layer shapes (item 3): each names its flag.
expect 3 "^moekit: error: --hidden: H must be a positive multiple of 8" bench --hidden 100
expect 3 "^moekit: error: --inter: F must be a positive multiple of 8.*got 3" bench --inter 3
expect 3 "^--topk: expected a whole number in \[1, 16\], got 0" bench --topk 0
expect 3 "^--experts: expected a whole number in \[1, 512\], got 0" bench --experts 0
expect 3 "^--experts: expected a whole number in \[1, 512\], got 100000" bench --experts 100000
expect 3 "--topk: k must be in \[1, min\(16, E = 8\)\], got 9" bench --topk 9
expect 3 "--hidden: --dtype fp8 needs H a multiple of 16" bench --dtype fp8 --hidden 4104
expect 3 "--n-group: must divide E = 8" bench --n-group 3 --topk-group 1
expect 3 "--topk-group: must be in \[1, n_group = 8\], got 9" bench --preset deepseek-v3 --topk-group 9
expect 3 "--tokens 300000000: .*'shape.tokens'.*32-bit sorted_ids" bench --preset deepseek-v3 --tokens 1,300000000
expect 3 "--hidden: H must be a positive multiple of 8" tune --hidden 100
expect 3 "--preset: unknown preset 'nope'; expected one of mixtral-8x7b, .*, gpt-oss-20b" bench --preset nope
# bench --backward is bf16 and one GPU: the other modes' flags are refused by name.
expect 3 "^moekit: error: --backward: the backward is bf16 only.*drop --dtype fp8" bench --backward --dtype fp8
expect 3 "^moekit: error: --backward: .*drop --ep" bench --backward --ep 2
expect 3 "^moekit: error: --backward: .*drop --ep" bench --preset deepseek-v3 --ep 1 --backward
expect 3 "^moekit: error: --hidden: H must be a positive multiple of 8" bench --backward --hidden 100
expect 3 "--backward-mma-sync requires --backward" bench --backward-mma-sync --preset mixtral-8x7b
# Numbers (item 4): readable ranges, no DBL_MAX in full.
expect 3 "^--tokens: expected a whole number in \[1, 2147483646\], got 0" bench --tokens 0
expect 3 "^--tokens: expected a whole number in \[1, 2147483646\], got -5" bench --tokens -5
expect 3 "^--tokens: expected a whole number in \[1, 2147483646\], got 'abc'" bench --tokens abc
expect 3 "^--tokens: expected a whole number" bench --tokens 1,2,x
expect 3 "^--steps: expected a whole number in \[1, 1000000\], got 0" bench --steps 0
expect 3 "^--steps: expected a whole number in \[1, 1000000\], got 0" tune --steps 0
expect 3 "^--warmup: expected a whole number in \[0, 1000000\], got -1" bench --warmup -1
expect 3 "^--tokens: expected a whole number" check --tokens 0
expect 3 "frobnicate" bench --frobnicate
# check --cpu refuses what it cannot honour instead of clamping (item 3).
expect 3 "^--topk: expected a whole number in \[1, 16\], got 300" check --cpu --topk 300
expect 3 "^--experts: expected a whole number in \[1, 512\], got 100000" check --cpu --experts 100000
expect 3 "--experts: check --cpu runs at most 64 experts" check --cpu --experts 100
expect 3 "^--topk: expected a whole number in \[1, 16\], got 0" check --cpu --topk 0
expect 3 "--hidden: check --cpu runs H up to 1024" check --cpu --hidden 4096
expect 0 "oracle OK" check --cpu --tokens 5
expect 0 "oracle OK" check --cpu --tokens 3 --experts 16 --topk 4 --hidden 128 --inter 64
# plan: no GPU needed with a described device. On the H200's name the table plans the presets; on
# the H100's the cost model does, but for its table's FP8 decode buckets (T <= 32-64) (its choice
# is listed even when past --top: it takes the earliest compiled candidate within 3% of the
# cheapest).
expect 0 "T=256 .*table:configs/nvidia-h200.json" plan --device h200 --preset qwen3-30b-a3b --tokens 256
expect 0 "^ +[0-9]+\. model +[0-9.]+ ms +up m32n64k128w1x4s[34] .*<- planned" plan --device h100 --preset qwen3-30b-a3b --tokens 256
expect 0 "T=16 .*table:configs/nvidia-h100-80gb-hbm3.json" plan --device h100 --preset deepseek-v3 --dtype fp8 --tokens 16
expect 0 "up fp8-m16n256k256w1x8s3 .*<- planned" plan --device h100 --preset deepseek-v3 --dtype fp8 --tokens 64
expect 0 "T=16384 .*wgmma" plan --device h100 --preset llama4-scout --tokens 1,16384 --top 1
expect 3 "^--device: .*nope" plan --device nope
expect 3 "^moekit: error: --hidden: H must be a positive multiple of 8" plan --hidden 100
expect 3 "^--top: expected a whole number in \[0, 1000\], got -1" plan --top -1
# Exit codes in every command's --help.
for cmd in bench check tune plan; do expect 0 "Exit codes: 0 ok; 1 .*; 2 .*; 3 bad command line" "$cmd" --help; done
expect 0 "--candidates TEXT +also append one JSON line per candidate" tune --help
expect 0 "^ +--backward +time the bf16 backward" bench --help
# check without a GPU and without --cpu: one line, exit 2 (a GPU machine runs the check instead).
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "skip: check without --cpu (a GPU is present)"
else
  expect 2 "^moekit check: no Hopper GPU .*moekit check --cpu" check
  expect 2 "^moekit bench --backward needs an NVIDIA Hopper GPU" bench --backward --preset qwen3-30b-a3b
  expect 2 "^moekit plan --device current needs an NVIDIA Hopper GPU" plan --device current
  # Every layer --preset names (its list from the tool's own refusal of an unknown one), the models
  # beyond the presets among them, is one the options accept (fp8 too): the GPU is the only refusal.
  layers=$("$MOEKIT" bench --preset nope 2>&1 | sed -n "s/.*expected one of //p" | tr -d ',')
  [ -n "$layers" ] || { echo "FAIL: no layer list in moekit bench --preset nope"; fails=$((fails + 1)); }
  for layer in $layers; do
    expect 2 "^moekit bench needs an NVIDIA Hopper GPU" bench --preset "$layer" --dtype fp8 --tokens 1,16384
  done
  lines=$("$MOEKIT" check 2>&1 | wc -l)
  [ "$lines" = 1 ] || { echo "FAIL: moekit check without a GPU printed $lines lines, expected 1"; fails=$((fails + 1)); }
fi

[ "$fails" = 0 ] && echo "cli_test: all passed" || echo "cli_test: $fails FAILED"
[ "$fails" = 0 ]
