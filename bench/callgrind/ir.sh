#!/bin/bash
# ir.sh LUA NCALLS KEYCOUNT KEYS... ARGS... : instructions (callgrind Ir) per EVALSHA of the
# script: redis-server under callgrind with hz 1; counters zeroed just before the calls
# and dumped just after (callgrind_control), one warm-up call first. $SETUP: redis-cli
# args run first. Needs valgrind, redis-server and redis-cli on PATH.
lua=$1; n=$2; shift 2
tmp=$(mktemp -d)
port=$((6420 + RANDOM % 500))
out=$tmp/cg.$port
rm -f $out*
valgrind --tool=callgrind --callgrind-out-file=$out redis-server --port $port --save '' --appendonly no --hz 1 > $tmp/vg.$port 2>&1 &
vpid=$!
for i in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
sha=$(redis-cli -p $port script load "$(cat $lua)")
if [[ -n $SETUP ]]; then eval "redis-cli -p $port $SETUP" > /dev/null; fi
redis-cli -p $port evalsha $sha "$@" > $tmp/first.$port
cmds=$( for i in $(seq $n); do printf 'EVALSHA %s' "$sha"; for a in "$@"; do printf ' "%s"' "$a"; done; printf '\n'; done )
callgrind_control -z $vpid > /dev/null
printf '%s\n' "$cmds" | redis-cli -p $port > $tmp/out.$port
callgrind_control -d $vpid > /dev/null
redis-cli -p $port shutdown nosave >/dev/null 2>&1
wait
dump=$(ls $out.* 2>/dev/null | head -1)
total=$(callgrind_annotate $dump 2>/dev/null | grep "PROGRAM TOTALS" | tr -d ',' | awk '{print $1}')
echo $(( total / n ))
