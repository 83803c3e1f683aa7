#!/usr/bin/env bash
# lonecall-compare.sh BASE [PAIRS] [ALGS] [CLIENTS]: the lone caller's p50 latency of
# the commit BASE against this tree, built from cmd/lonecall (which both can build) and
# run in turns, base then this tree, PAIRS times (default 3) per algorithm and client,
# on one redis-server this script starts on a free 127.0.0.1 port and stops.
#   cd bench && ./lonecall-compare.sh f0269a6^ 3 "TokenBucket SlidingWindow" "default lean"
set -euo pipefail
base=${1:?usage: lonecall-compare.sh BASE [PAIRS] [ALGS] [CLIENTS]}
pairs=${2:-3}
algs=${3:-TokenBucket SlidingWindow}
clients=${4:-default}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
work=$(mktemp -d)
cleanup() {
  [[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  git -C "$top" worktree remove --force "$work/base-tree" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

git -C "$top" worktree add --detach -q "$work/base-tree" "$base"
# build NAME TREE: cmd/lonecall as a module of its own whose jobthrottle is TREE
build() {
  local dir=$work/$1
  mkdir -p "$dir"
  cp "$here/cmd/lonecall/main.go" "$here/go.sum" "$dir/"
  sed "s|^module .*|module lonecall|; s|^replace github.com/jobthrottle/jobthrottle => .*|replace github.com/jobthrottle/jobthrottle => $2|" \
    "$here/go.mod" >"$dir/go.mod"
  (cd "$dir" && GOFLAGS=-mod=mod go build -o "$work/lonecall-$1" .)
}
build base "$work/base-tree"
build this "$top"

# a port nobody listens on, and a server that answers there (or the script stops)
while :; do
  port=$((20000 + RANDOM % 40000))
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null || break
done
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
  --daemonize no --loglevel warning >/dev/null &
pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$port" ping >/dev/null 2>&1 || { echo "redis-server on $port did not start" >&2; exit 1; }

echo "base $(git -C "$top" rev-parse --short "$base"), this tree $(git -C "$top" rev-parse --short HEAD)$([[ -n $(git -C "$top" status --porcelain) ]] && echo ' (with changes)'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
for alg in $algs; do
  for client in $clients; do
    for _ in $(seq "$pairs"); do
      "$work/lonecall-base" -addr "127.0.0.1:$port" -tag base -alg "$alg" -client "$client"
      "$work/lonecall-this" -addr "127.0.0.1:$port" -tag this -alg "$alg" -client "$client"
    done
  done
done
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
