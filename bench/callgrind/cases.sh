#!/bin/bash
# cases.sh GENDIR [N]: callgrind instructions (Ir) per EVALSHA of the generated scripts in GENDIR
# (lua/gen, or a luaexec -dump directory), N calls after one: Ir per call for TB lone tenant, TB batch 32 tenants (per request), TB plain, FW tenant, TB tenant denied holding a place and not, and per request of a batch of 64 tenants' Waits in a backlog
g=$1; n=${2:-500}
G="tb 1000000000 1000000 1000000000"; C="tb 100000000 1000000 100000000"
bk=(); ba=()
for i in $(seq 0 31); do bk+=("{b}:t:t$i"); ba+=("a 1 0 q2 c$((i+3)) tt$i"); done
a=$("$(dirname "$0")"/ir.sh $g/bucket.lua $n 3 '{t}:l' '{t}:q' '{t}:t:acme' "$G" "$C" 'a 1 0 q2 c3 tacme')
b=$("$(dirname "$0")"/ir.sh $g/bucket.lua $((n/10)) 34 '{b}:l' '{b}:q' "${bk[@]}" "$G" "$C" "${ba[@]}")
c=$("$(dirname "$0")"/ir.sh $g/bucket.lua $n 1 '{p}:l' "$G" '' 'a 1 0')
d=$("$(dirname "$0")"/ir.sh $g/window.lua $n 3 '{t}:l' '{t}:q' '{t}:t:acme' "fw 1000000000 1000000" "fw 100000000 1000000" 'a 1 0 q2 c3 tacme')
# a group of 1 an hour: every call after the first denied, taking a place (a Wait's) or not (an Allow's)
e=$("$(dirname "$0")"/ir.sh $g/bucket.lua $n 3 '{t}:l' '{t}:q' '{t}:t:acme' "tb 1 3600000000 1" "$C" 'a 1 9000000000 q2 c3 h tacme')
f=$("$(dirname "$0")"/ir.sh $g/bucket.lua $n 3 '{t}:l' '{t}:q' '{t}:t:acme' "tb 1 3600000000 1" "$C" 'a 1 0 q2 c3 tacme')
# 64 tenants' Waits on a group of 100/s, the same every call, all at one instant (the script's
# TIME fixed: every run goes alike): after the first call, each one told when its turn comes
bl=(); for i in $(seq 0 63); do bl+=("a 1 9000000000 q2 h tt$i"); done
fixed=$(mktemp --suffix .lua)
sed "s/  local t = redis.call('TIME')/  local t = {'1765000000', '000000'}/" $g/bucket.lua > "$fixed"
h=$("$(dirname "$0")"/ir.sh "$fixed" $((n/50)) 2 '{w}:l' '{w}:q' "tb 100 1000000 100" "" "${bl[@]}")
rm -f "$fixed"
echo "TB tenant lone: $a  TB tenant batch32 per req: $((b/32))  TB plain: $c  FW tenant lone: $d  TB tenant denied, holding: $e  TB tenant denied: $f  TB backlog batch64 per req: $((h/64))"
