#!/usr/bin/env bash
# Two Ray nodes on one Linux machine, each in its own network namespace, joined by a veth pair; a small CPU sweep
# with `attnbench run --executor ray` on them, and the second node killed partway through it. As root.
#
#   scripts/ray_two_nodes.sh OUT_DIR
#
# The run folder lands at OUT_DIR/two-nodes; OUT_DIR/driver.log holds what the driver printed, OUT_DIR/timeline.txt
# when each step happened. It exits 0 only when the run ended and its rows name both nodes, one row per pair of the
# manifest, none lost to the killed node (no `error` or `crashed` row). Everything it makes (the namespaces and their
# veth pair, the Ray processes, its temp folder) is removed at the end, also when it fails or is interrupted.
# PYTHON: the Python that has attnbench's dependencies and Ray (default: .venv/bin/python of this checkout).
set -euo pipefail

if [[ $# -ne 1 || $1 == -* ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
if [[ $(id -u) -ne 0 ]]; then
    echo "$0: needs root (it makes network namespaces)" >&2
    exit 2
fi
if ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
    echo "$0: needs iproute2's 'ip netns' (network namespaces)" >&2
    exit 2
fi
[[ -x $PYTHON ]] || { echo "$0: no Python at $PYTHON (set PYTHON)" >&2; exit 2; }
mkdir -p "$1"
OUT=$(cd "$1" && pwd)

TAG=ab2n$$                       # names of this run's namespaces and links (at most 15 characters for a link)
NS_HEAD=${TAG}h NS_NODE=${TAG}n
VETH_HEAD=${TAG}a VETH_NODE=${TAG}b
WORK=$(mktemp -d /tmp/ab2n-XXXXXX)   # short: Ray's socket paths must fit in 107 bytes
TIMELINE=$OUT/timeline.txt
START=$(date +%s.%N)
: >"$TIMELINE"

mark() {  # seconds since the start, and what happened
    local line
    line=$(printf '%7.1f s  %s' "$(echo "$(date +%s.%N) - $START" | bc)" "$*")
    echo "$line" | tee -a "$TIMELINE"
}

kill_namespace() {  # every process in a namespace (the Ray processes started there), then the namespace itself
    local ns=$1 pids
    ip netns list | grep -qw "$ns" || return 0
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
    for _ in $(seq 50); do
        [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
        sleep 0.1
    done
    ip netns delete "$ns" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [[ -n ${DRIVER_PID:-} ]] && kill -9 "$DRIVER_PID" 2>/dev/null || true
    kill_namespace "$NS_NODE"
    kill_namespace "$NS_HEAD"
    ip link delete "$VETH_HEAD" 2>/dev/null || true   # gone with its namespace, unless a step failed before moving it
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- the topology: 10.N.M.1 (head) <-> 10.N.M.2 (second node), a /30 on the veth pair only --------------------------
for _ in $(seq 20); do
    NET=10.$((200 + RANDOM % 50)).$((RANDOM % 256))
    ip -o addr | grep -q " $NET\." || break
done
HEAD_IP=$NET.1 NODE_IP=$NET.2 PORT=6379
ip netns add "$NS_HEAD"
ip netns add "$NS_NODE"
ip link add "$VETH_HEAD" type veth peer name "$VETH_NODE"
ip link set "$VETH_HEAD" netns "$NS_HEAD"
ip link set "$VETH_NODE" netns "$NS_NODE"
ip -n "$NS_HEAD" addr add "$HEAD_IP/30" dev "$VETH_HEAD"
ip -n "$NS_NODE" addr add "$NODE_IP/30" dev "$VETH_NODE"
for ns in "$NS_HEAD" "$NS_NODE"; do ip -n "$ns" link set lo up; done
ip -n "$NS_HEAD" link set "$VETH_HEAD" up
ip -n "$NS_NODE" link set "$VETH_NODE" up
mark "namespaces $NS_HEAD ($HEAD_IP) and $NS_NODE ($NODE_IP) joined by veth $VETH_HEAD<->$VETH_NODE"

# -- Ray on both sides, with one shared token (without it the second `ray start` fails with InvalidAuthToken) --------
TOKEN=$("$PYTHON" -c "import secrets; print(secrets.token_hex(32))")
mkdir -p "$WORK/home" "$WORK/head" "$WORK/node"
# The tasks import attnbench from this checkout; HOME in WORK keeps Ray from writing a token under the real home.
# The health checks are Ray's knob for how soon a silent node is declared dead (default about 30 s).
in_ns() {
    local ns=$1; shift
    # Unset: an address of another cluster, and the loopback-only switch a single-machine Ray may have left set.
    ip netns exec "$ns" env -u RAY_ADDRESS -u RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER HOME="$WORK/home" PYTHONPATH="$ROOT" RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$TOKEN" \
        RAY_USAGE_STATS_ENABLED=0 RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=5 "$@"
}
ray_cli() { local ns=$1; shift; (cd "$ROOT" && in_ns "$ns" "$PYTHON" -m ray.scripts.scripts "$@"); }

ray_cli "$NS_HEAD" start --head --node-ip-address="$HEAD_IP" --port=$PORT --num-cpus=1 --num-gpus=0 \
    --include-dashboard=false --disable-usage-stats --temp-dir="$WORK/head" --object-store-memory=100000000 \
    >"$OUT/ray-head.log" 2>&1 || { tail -5 "$OUT/ray-head.log" >&2; echo "$0: the Ray head did not start" >&2; exit 1; }
mark "Ray head up at $HEAD_IP:$PORT (1 CPU)"
ray_cli "$NS_NODE" start --address="$HEAD_IP:$PORT" --node-ip-address="$NODE_IP" --num-cpus=1 --num-gpus=0 \
    --disable-usage-stats --temp-dir="$WORK/node" --object-store-memory=100000000 >"$OUT/ray-node.log" 2>&1 ||
    { tail -5 "$OUT/ray-node.log" >&2; echo "$0: the second Ray node did not start" >&2; exit 1; }
for _ in $(seq 120); do
    nodes=$(cd "$ROOT" && in_ns "$NS_HEAD" "$PYTHON" -c "
import ray, logging
ray.init(address='$HEAD_IP:$PORT', logging_level=logging.ERROR, log_to_driver=False)
print(sum(1 for n in ray.nodes() if n['Alive']))" 2>/dev/null || echo 0)
    [[ $nodes == 2 ]] && break
    sleep 1
done
[[ $nodes == 2 ]] || { echo "$0: the second node did not join the head (see $OUT/ray-node.log)" >&2; exit 1; }
mark "second Ray node joined from $NODE_IP (1 CPU): 2 nodes alive"

# -- the sweep: 6 cases x 3 CPU backends, a fraction of a second a pair --------------------------------------------
cat >"$WORK/two_nodes.toml" <<'EOF'
name = "two-nodes"
device = "cpu"
backends = ["naive", "sdpa", "sdpa-math"]

[budget]
warmup_s = 0.02
measure_s = 0.3
max_rounds = 100

[[grid]]
B = 1
S = [64, 96, 128, 192, 256, 384]
H = 2
d_k = 32
EOF
RUN=$OUT/two-nodes
rm -rf "$RUN"
(cd "$ROOT" && in_ns "$NS_HEAD" "$PYTHON" -m harness run --suite "$WORK/two_nodes.toml" --device cpu --executor ray \
    --ray-address "$HEAD_IP:$PORT" --out "$OUT" --run-id two-nodes --no-remeasure --quiet) >"$OUT/driver.log" 2>&1 &
DRIVER_PID=$!
mark "driver started in $NS_HEAD: attnbench run --executor ray --ray-address $HEAD_IP:$PORT (pid $DRIVER_PID)"

# -- partway: when a case the second node has given a row of is unfinished (its task is on the case's next pair) and a
#    quarter of the pairs have rows, kill every process of the second node ------------------------------------------
PAIRS=18
on_next_pair_of_case() {  # a case the second node has given a row of is unfinished: its task is on that case's next pair
    local case
    while read -r case; do
        (($(grep -c "$case" "$RUN/records.jsonl") < 3)) && return 0
    done < <(grep "\"node\":\"$NODE_IP\"" "$RUN/records.jsonl" | grep -o '"case_id":"[^"]*"' | sort -u)
    return 1
}
killed=no seen=0
report_losses() {  # the driver's lines about a lost node, on the timeline as they appear
    local lines
    mapfile -t lines < <(grep "left the cluster" "$OUT/driver.log" || true)
    while ((seen < ${#lines[@]})); do
        mark "driver: ${lines[seen]#attnbench: }"
        seen=$((seen + 1))
    done
}
while kill -0 "$DRIVER_PID" 2>/dev/null; do
    report_losses
    if [[ $killed == no && -s $RUN/records.jsonl ]] && (($(wc -l <"$RUN/records.jsonl") >= PAIRS / 4)) && on_next_pair_of_case; then
        rows=$(wc -l <"$RUN/records.jsonl")
        kill -9 $(ip netns pids "$NS_NODE") 2>/dev/null || true
        killed=yes
        mark "killed every process of $NS_NODE (the second node) after $rows of $PAIRS rows, $(grep -c "\"node\":\"$NODE_IP\"" "$RUN/records.jsonl") of them its own"
    fi
    sleep 0.2
done
set +e
wait "$DRIVER_PID"
rc=$?
set -e
DRIVER_PID=
report_losses
mark "driver exited $rc"
[[ $rc -eq 0 ]] || { tail -20 "$OUT/driver.log" >&2; exit 1; }
[[ $killed == yes ]] || { echo "$0: the sweep ended before the second node gave a row: nothing was killed" >&2; exit 1; }

# -- what the run must show --------------------------------------------------------------------------------------
"$PYTHON" - "$RUN" "$HEAD_IP" "$NODE_IP" <<'EOF'
import json, sys
from collections import Counter
from pathlib import Path
run, head, node = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
pairs = set(json.loads((run / "manifest.json").read_text())["pairs"])
rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]
per_pair = Counter(f"{r['case_id']}-{r['backend']}" for r in rows)
per_node = Counter(r.get("node") for r in rows)
bad = [f"{r['case_id']}-{r['backend']}: {r['status']} {r.get('reason')}" for r in rows if r["status"] in ("error", "crashed")]
print(f"rows per node: {dict(per_node)}; statuses: {dict(Counter(r['status'] for r in rows))}")
problems = []
if set(per_node) != {head, node}:
    problems.append(f"rows name the nodes {sorted(map(str, per_node))}, not {head} and {node}")
if set(per_pair) != pairs or any(n != 1 for n in per_pair.values()):
    problems.append(f"not one row per manifest pair: missing {sorted(pairs - set(per_pair))}, "
                    f"doubled {sorted(k for k, n in per_pair.items() if n > 1)}")
problems += [f"row lost to the killed node: {b}" for b in bad]
for problem in problems:
    print(f"ray_two_nodes: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
mark "checked: $RUN has one row per manifest pair, from both nodes, none lost"
