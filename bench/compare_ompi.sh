#!/usr/bin/env bash
# compare_ompi.sh: ferroccl (ferroccl-bench, through its NCCL C API) against Open MPI
# (bench/ompi_bench.c: MPI_Allreduce float sum, MPI_Allgather, MPI_Bcast, MPI_Reduce_scatter_block
# float sum), side by side, on the
# same ranks, sizes and iteration schedule, in one run (issue 5 section 4).
#
#   bench/compare_ompi.sh [-np N ...] [--sizes 8:256M] [--factor 2|4] [--out bench/results/NAME]
#                         [-n 100] [-w 10] [--tier S:N:W ...] [--repeat 1] [--check 1] [--timeout 900]
#                         [--wait-idle PCT] [--wait-max S]
#                         [--ferroccl-bench PATH] [--no-build] [--keep-logs] [--nccl-tests-warmup] [--arrays] [--unalign N]
#
#   -np N          rank counts, repeatable or comma-separated (default: 2 and 4)
#   --sizes A:B    size range, K/M/G suffixes are powers of 1024 (default 8:256M)
#   --factor F     size multiplier, 2 or 4 (default 2)
#   -n / -w        timed / warm-up iterations per size below the first tier (default 100 / 10)
#   --tier S:N:W   sizes >= S use N timed and W warm-up iterations; repeatable, the largest
#                  matching S wins (default: --tier 1M:20:5 --tier 64M:5:2). Small calls take
#                  about a microsecond, so they get more iterations: 20 would time a 20 us window
#                  that one scheduler tick on a shared 2-core host can double.
#                  Both programs get the same schedule and sweep every size in one invocation,
#                  in buffers of the largest size (unless --arrays).
#   --fresh-inputs both programs rewrite each rank's input before every call (timed with it), as an
#                  application with new data would; without it inputs never change between calls
#   --unalign N    both programs start every buffer N floats (4N bytes) past where they would
#                  (ferroccl-bench -u N, ompi_bench -u N): an array section such as a(2:n)
#   --arrays       both programs time each size in send and receive arrays of their own, of
#                  exactly its bytes (ferroccl-bench --arrays, ompi_bench --arrays), as a
#                  simulation code passes arrays of its problem's size: each one a glibc mapping
#                  on 4 KiB pages from 128 KiB, where the default's one buffer of the largest size
#                  may get huge pages (bench/results/app-arrays-2026-12-07.md). Each size warms up
#                  in its own arrays, right before it is timed; no pass over all sizes.
#   --nccl-tests-warmup  warm up as nccl-tests does (ferroccl-bench: one pass over all sizes before
#                  the sweep, after which the first sizes timed are cold; ompi_bench: each size
#                  right before it is timed). Default: both programs do both (ferroccl-bench
#                  --warmup-each, ompi_bench --warmup-pass), so that both warm up alike.
#   --repeat R     run each pair of sweeps R times, alternating the programs, and report per size
#                  the fastest of the R (lowest out-of-place time; in-place likewise). Default 1:
#                  one nccl-tests-style mean per size. All repeats are kept in the JSON.
#   --check C      checked calls per size for both programs (default 1; 0 = no data check)
#   --out PREFIX   writes PREFIX.md, PREFIX.json and PREFIX.png
#                  (default bench/results/ompi-compare-<date>)
#   --timeout S    seconds allowed per mpirun (default 900)
#   --wait-idle PCT  before each pair of sweeps, wait until other work keeps less than PCT % of
#                  the CPUs busy (sampled over half a second), for at most --wait-max seconds
#                  (default 600); for shared hosts. Off by default. The busy share measured before
#                  every run is in the report either way.
#   --ferroccl-bench PATH  use this binary instead of building it; --no-build: do not run cargo
#                  (the binary is then looked up in $CARGO_TARGET_DIR/release)
#   --keep-logs    keep the raw program outputs (PREFIX-logs/)
#   --report-from DIR  run nothing: write the report from the raw outputs in DIR (a PREFIX-logs/
#                  of --keep-logs, say of a run cut short; pass the same -np and --colls). A run
#                  without an exit status shows under "Failed runs"; cells use what finished.
#   --colls LIST   collectives, comma-separated (default all_reduce,all_gather,broadcast,reduce_scatter)
#   --both-allocs  ferroccl-bench runs twice per repeat, malloc'd buffers then ncclMemAlloc ones:
#                  the report shows both times, their ratio and issue 15's target (malloc'd
#                  within 1.25x of ncclMemAlloc's time at every size)
#   --mem-alloc    ferroccl-bench allocates its buffers with ncclMemAlloc (nccl-tests' way,
#                  which ranks on one host map and reduce in place) instead of the system
#                  allocator, which is the default: malloc'd buffers, as ompi_bench and the
#                  simulation codes use. --host-alloc (the default) is accepted.
#
# Environment: CARGO_TARGET_DIR (default <repo>/target), PYTHON (default python3; it needs only
# the standard library for the report, and matplotlib for the PNG, which is skipped without it;
# /usr/bin/python3 draws the PNG when it has matplotlib and $PYTHON has not),
# MPIRUN (default mpirun), MPICC (default mpicc).
#
# How both programs run (the same for both):
#   mpirun -np N --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo, with
#   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment.
#   --oversubscribe: 4 ranks on a 2-core host.
#   --bind-to none: Open MPI 4.1 binds ranks to cores for np <= 2 and to sockets above, and not
#     at all when oversubscribed, so its default would place 2 and 4 ranks differently; and a
#     core binding would also pin ferroccl's helper threads (which its topology code places itself)
#     onto the rank's core. No binding gives both libraries the same placement at every N.
#   NCCL_SOCKET_IFNAME=lo: only loopback is used on this host. Ranks are processes of one host,
#     so ferroccl uses its shared-memory transport (the transport lines are recorded in the report).
#   Open MPI runs with its default MCA settings (what users get: the vader/sm BTL on one host).
#
# Checks the issue's targets and prints PASS/MISS for each: all-reduce busbw >= 2x Open MPI's for
# every size >= 1 MiB, and all-reduce 8-byte latency no worse than Open MPI's, at every N. It is a
# benchmark, not a test: it exits 0 whatever the targets say (non-zero only for usage or build
# errors).
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cmdline="$0 $*"

nps=()
colls=(all_reduce all_gather broadcast reduce_scatter)
sizes="8:256M"
factor=2
iters=100
warmup=10
tiers=()
check=1
repeat=1
wait_idle=""
wait_max=600
out=""
timeout_s=900
fbench=""
fextra=(--alloc system)
both_allocs=0
fresh=()
arrays=0
unalign=()
build=1
keep_logs=0
warm_alike=1
report_from=""

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "compare_ompi.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        -np|--np) [ $# -ge 2 ] || die "-np needs a value"; IFS=, read -ra v <<<"$2"; nps+=("${v[@]}"); shift 2 ;;
        --sizes) [ $# -ge 2 ] || die "--sizes needs A:B"; sizes=$2; shift 2 ;;
        --factor|-f) [ $# -ge 2 ] || die "--factor needs a value"; factor=$2; shift 2 ;;
        -n) [ $# -ge 2 ] || die "-n needs a value"; iters=$2; shift 2 ;;
        -w) [ $# -ge 2 ] || die "-w needs a value"; warmup=$2; shift 2 ;;
        --tier|--big) [ $# -ge 2 ] || die "--tier needs S:N:W"; tiers+=("$2"); shift 2 ;;
        --wait-idle) [ $# -ge 2 ] || die "--wait-idle needs a percentage"; wait_idle=$2; shift 2 ;;
        --wait-max) [ $# -ge 2 ] || die "--wait-max needs seconds"; wait_max=$2; shift 2 ;;
        --repeat) [ $# -ge 2 ] || die "--repeat needs a value"; repeat=$2; shift 2 ;;
        --check|-c) [ $# -ge 2 ] || die "--check needs a value"; check=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a prefix"; out=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; timeout_s=$2; shift 2 ;;
        --ferroccl-bench) [ $# -ge 2 ] || die "--ferroccl-bench needs a path"; fbench=$2; build=0; shift 2 ;;
        --no-build) build=0; shift ;;
        --keep-logs) keep_logs=1; shift ;;
        --nccl-tests-warmup) warm_alike=0; shift ;;
        --fresh-inputs) fresh=(--fresh-inputs); shift ;;
        --arrays) arrays=1; shift ;;
        --unalign|-u) [ $# -ge 2 ] || die "--unalign needs a count"; [[ $2 =~ ^[0-9]+$ ]] || die "--unalign wants an integer >= 0"
            unalign=(-u "$2"); shift 2 ;;
        --report-from) [ $# -ge 2 ] || die "--report-from needs a directory"; report_from=$2; shift 2 ;;
        --host-alloc) fextra=(--alloc system); shift ;;
        --mem-alloc) fextra=(--alloc nccl); shift ;;
        --both-allocs) both_allocs=1; fextra=(--alloc system); shift ;;
        --colls) [ $# -ge 2 ] || die "--colls needs a list"; IFS=, read -ra colls <<<"$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ ${#nps[@]} -gt 0 ] || nps=(2 4)
for n in "${nps[@]}"; do [[ $n =~ ^[0-9]+$ && $n -ge 2 ]] || die "-np wants integers >= 2, got '$n'"; done
[[ $factor =~ ^[0-9]+$ && $factor -ge 2 ]] || die "--factor wants an integer >= 2"
[[ $iters =~ ^[0-9]+$ && $iters -ge 1 ]] || die "-n wants an integer >= 1"
[[ $warmup =~ ^[0-9]+$ ]] || die "-w wants an integer >= 0"
[[ $check =~ ^[0-9]+$ ]] || die "--check wants an integer >= 0"
[[ $repeat =~ ^[0-9]+$ && $repeat -ge 1 ]] || die "--repeat wants an integer >= 1"
[[ -z $wait_idle || $wait_idle =~ ^[0-9]+$ ]] || die "--wait-idle wants an integer percentage"
[[ $wait_max =~ ^[0-9]+$ ]] || die "--wait-max wants seconds"

# Sizes as nccl-tests parses them (K, M, G: powers of 1024; integers only here).
to_bytes() {
    local s=$1 num unit
    [[ $s =~ ^([0-9]+)([kKmMgG]?)$ ]] || die "bad size '$s'"
    num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[2]}
    case "$unit" in
        k|K) echo $((num << 10)) ;; m|M) echo $((num << 20)) ;; g|G) echo $((num << 30)) ;; *) echo "$num" ;;
    esac
}
[[ $sizes == *:* ]] || die "--sizes wants MIN:MAX"
minb=$(to_bytes "${sizes%%:*}") || exit 2
maxb=$(to_bytes "${sizes##*:}") || exit 2
[ "$minb" -ge 1 ] && [ "$minb" -le "$maxb" ] || die "--sizes: need 1 <= MIN <= MAX"
[ ${#tiers[@]} -gt 0 ] || tiers=(1M:20:5 64M:5:2)
tier_b=(); tier_n=(); tier_w=(); ompi_tiers=()
for t in "${tiers[@]}"; do
    IFS=: read -r t_s t_n t_w <<<"$t"
    [ -n "${t_w:-}" ] || die "--tier wants S:N:W, got '$t'"
    b=$(to_bytes "$t_s") || exit 2
    [[ $t_n =~ ^[0-9]+$ && $t_n -ge 1 && $t_w =~ ^[0-9]+$ ]] || die "--tier '$t': bad iteration counts"
    tier_b+=("$b"); tier_n+=("$t_n"); tier_w+=("$t_w"); ompi_tiers+=(--tier "$b:$t_n:$t_w")
done

# ferroccl-bench applies the tiers itself too (--tier), so each program sweeps every size in one
# invocation, in buffers of the largest size: the same buffers for both. (Before, ferroccl-bench ran
# once per tier, so sizes below the first tier ran in buffers of that tier's size, where Open MPI's
# were of the largest: 4 KiB pages against huge ones, bench/results/buffer-size-16core-2026-12-05.md.)
# Warm-up: ferroccl-bench by default follows nccl-tests (one pass over all sizes before the sweep,
# after which the first sizes timed find caches and slots cold), ompi_bench warms each size right
# before timing it. Unless --nccl-tests-warmup, both do both (ferroccl-bench --warmup-each, which
# keeps the pass, and ompi_bench --warmup-pass). Per-size warm-up without the pass put one-time
# huge-page collapses into ferroccl's timed loops (a 2-rank 128 KiB all-reduce 115-144 us a call
# against 12 in place, bench/results/buffer-size-16core-2026-12-05.md); the pass takes them first.
fwarm=(); owarm=()
if [ "$warm_alike" = 1 ]; then fwarm=(--warmup-each); owarm=(--warmup-pass); fi
# --fresh-inputs: both programs rewrite each rank's input before every call.
fwarm+=("${fresh[@]}"); owarm+=("${fresh[@]}")
# --arrays: each size in arrays of its own, warmed up in them (a pass over all sizes would warm
# other arrays).
if [ "$arrays" = 1 ]; then fwarm=(--arrays "${fresh[@]}"); owarm=(--arrays "${fresh[@]}"); fi
# --unalign: both programs start their buffers that many floats past where they would.
fwarm+=("${unalign[@]}"); owarm+=("${unalign[@]}")
ftiers=()
for k in "${!tier_b[@]}"; do ftiers+=(--tier "${tier_b[k]}:${tier_n[k]}:${tier_w[k]}"); done

date_tag=$(date +%Y-%m-%d)
[ -n "$out" ] || out="$root/bench/results/ompi-compare-$date_tag"
mkdir -p "$(dirname "$out")" || die "cannot create $(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

PYTHON=${PYTHON:-python3}
MPIRUN=${MPIRUN:-mpirun}
MPICC=${MPICC:-mpicc}
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (needed for the report)"
command -v "$MPIRUN" >/dev/null || die "$MPIRUN not found"
command -v "$MPICC" >/dev/null || die "$MPICC not found"
target=${CARGO_TARGET_DIR:-$root/target}

if [ -n "$report_from" ]; then
    [ -f "$report_from/meta.txt" ] || die "no meta.txt in $report_from (not a --keep-logs directory)"
    logs=$report_from
else
logs=$(mktemp -d "${TMPDIR:-/tmp}/compare_ompi.XXXXXX") || die "mktemp failed"
if [ "$keep_logs" -eq 1 ]; then
    trap 'rm -rf "$out-logs"; mv "$logs" "$out-logs" && echo "# logs in $out-logs"' EXIT
else
    trap 'rm -rf "$logs"' EXIT
fi

# ---- build --------------------------------------------------------------------------------
if [ -z "$fbench" ]; then
    if [ "$build" -eq 1 ]; then
        echo "# building ferroccl-bench (CARGO_TARGET_DIR=$target)"
        if ! (cd "$root" && CARGO_TARGET_DIR=$target cargo build --release -p ferroccl-bench) \
            >"$logs/build.txt" 2>&1; then
            tail -30 "$logs/build.txt" >&2
            die "cargo build -p ferroccl-bench failed"
        fi
    fi
    fbench=$target/release/ferroccl-bench
fi
[ -x "$fbench" ] || die "no ferroccl-bench at $fbench"
mkdir -p "$target/ompi_bench" || die "cannot create $target/ompi_bench"
obench=$target/ompi_bench/ompi_bench
echo "# building ompi_bench ($MPICC -O2)"
"$MPICC" -O2 -Wall -o "$obench" "$here/ompi_bench.c" || die "mpicc failed"
# The cache-line round trip between CPU 0 and CPU 1 (bench/pingpair.c), before and after each
# run: a VM's host moves its vCPUs near and far, and data that crosses between ranks every call
# then moves several times slower (bench/results/vcpu-distance-2026-12-07.md). Best effort.
pingpair=$target/ompi_bench/pingpair
[ "$(nproc)" -ge 2 ] && "$MPICC" -O2 -pthread -o "$pingpair" "$here/pingpair.c" 2>/dev/null || pingpair=


export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=("$MPIRUN" --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo)

# ---- machine and versions -------------------------------------------------------------------
{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "command_line=$cmdline"
    echo "host=$(hostname)"
    echo "cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
    echo "cpus=$(nproc 2>/dev/null)"
    echo "cores_per_socket=$(lscpu 2>/dev/null | sed -n 's/^Core(s) per socket:[[:space:]]*//p' | head -1)"
    echo "sockets=$(lscpu 2>/dev/null | sed -n 's/^Socket(s):[[:space:]]*//p' | head -1)"
    echo "threads_per_core=$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core:[[:space:]]*//p' | head -1)"
    echo "memory=$(free -h 2>/dev/null | awk '/^Mem:/ {print $2}')"
    echo "kernel=$(uname -sr)"
    echo "ompi_version=$(ompi_info --version 2>/dev/null | head -1)"
    echo "mpicc=$("$MPICC" --version 2>/dev/null | head -1)"
    # GIT_COMMIT names the build when this tree's git metadata does not (a copied tree).
    echo "git_commit=${GIT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo '+uncommitted')}"
    echo "ferroccl_bench=$fbench"
    echo "repeat=$repeat"
    echo "both_allocs=$both_allocs"
    echo "wait_idle=${wait_idle:+$wait_idle% busy, at most ${wait_max}s}"
    echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$logs/meta.txt"

# ferroccl's version line and transport, from a one-size run with NCCL_DEBUG=INFO.
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL timeout 120 "${launch[@]}" -np 2 -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS "$fbench" all_reduce -b 1M -e 1M -n 1 -w 0 -c 0 \
    "${fextra[@]}" >"$logs/probe.txt" 2>&1
# Links connect on first use, and all-reduce, all-gather and small and large broadcasts on one
# host go through the node area: the point-to-point transport shows in a 24 KB broadcast
# (between the node area's one-shot and pull sizes at 2 ranks).
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL timeout 120 "${launch[@]}" -np 2 -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS "$fbench" broadcast -b 24K -e 24K -n 1 -w 0 -c 0 \
    "${fextra[@]}" >>"$logs/probe.txt" 2>&1
{
    echo "ferroccl_version=$(grep -m1 'NCCL INFO NCCL version' "$logs/probe.txt" | sed 's/.*NCCL INFO //')"
    echo "ferroccl_bench_version=$(grep -m1 '^# ferroccl-bench version' "$logs/probe.txt" | sed 's/^# //')"
    echo "ferroccl_transport=$(grep -o ' via [^ ]*' "$logs/probe.txt" | sed 's/^ via //' | sort | uniq -c |
        awk '{printf "%s%s (%s connections)", (NR > 1 ? ", " : ""), $2, $1}') at 2 ranks (24 KB broadcast)"
    echo "ferroccl_node_area=$(grep -m1 -o 'Node area: .*' "$logs/probe.txt")"
    echo "ferroccl_buffers=$(grep -m1 -o 'host memory from .*' "$logs/probe.txt" | sed 's/^host memory from //')"
    echo "ferroccl_transport_lines=$(grep -o 'Channel .* via .*' "$logs/probe.txt" | sort -u | paste -sd ';' -)"
} >>"$logs/meta.txt"
# Open MPI's point-to-point layer and shared-memory copy mechanism, as this launch selects them.
timeout 120 "${launch[@]}" -np 2 --mca pml_base_verbose 10 "$obench" -C all_reduce -b 8 -e 8 -n 1 -w 0 -c 0 \
    >"$logs/probe-ompi.txt" 2>&1
{
    echo "ompi_pml=$(sed -n 's/.*selected \([a-z0-9]*\) best priority.*/\1/p' "$logs/probe-ompi.txt" | sort -u | paste -sd, -)"
    echo "ompi_vader_single_copy=$(ompi_info --param btl vader --level 9 2>/dev/null |
        sed -n 's/.*btl_vader_single_copy_mechanism" (current value: "\([^"]*\)".*/\1/p' | head -1)"
} >>"$logs/meta.txt"
sed 's/^/# /' "$logs/meta.txt"

# ---- runs -------------------------------------------------------------------------------------
# Share of the CPUs busy over half a second (nothing of ours runs then): other work on the host.
cpu_busy() {
    local a b
    read -ra a < <(grep '^cpu ' /proc/stat)
    sleep 0.5
    read -ra b < <(grep '^cpu ' /proc/stat)
    local i tot=0 idle
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + ${b[i]:-0} - ${a[i]:-0})); done
    idle=$(( (${b[4]} - ${a[4]}) + (${b[5]:-0} - ${a[5]:-0}) ))
    [ "$tot" -gt 0 ] && echo $(( (100 * (tot - idle) + tot / 2) / tot )) || echo 0
}

wait_for_idle() { # tag
    [ -n "$wait_idle" ] || return 0
    local start=$SECONDS b
    while b=$(cpu_busy); [ "$b" -ge "$wait_idle" ]; do
        if [ $((SECONDS - start)) -ge "$wait_max" ]; then
            echo "#   host still ${b}% busy after ${wait_max}s; running anyway"
            echo "timeout $((SECONDS - start)) $b" >"$logs/$1.wait"
            return 0
        fi
        sleep 2
    done
    echo "ok $((SECONDS - start)) $b" >"$logs/$1.wait"
}

# Steal time (a virtual machine's CPUs lent to other guests) as a share of the CPU time that
# passed between two /proc/stat cpu lines: invisible before a run, it slows the run itself.
steal_pct() { # "cpu ..." line before, line after
    local -a a b
    read -ra a <<<"$1"
    read -ra b <<<"$2"
    local i tot=0
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + ${b[i]:-0} - ${a[i]:-0})); done
    [ "$tot" -gt 0 ] && echo $(( (100 * (${b[8]:-0} - ${a[8]:-0}) + tot / 2) / tot )) || echo 0
}

rtt_ns() { [ -n "$pingpair" ] && timeout 5 "$pingpair" 0 1 0.1 2>/dev/null; }

run_logged() { # name cmd...
    local name=$1; shift
    echo "$*" >"$logs/$name.cmd"
    cpu_busy >"$logs/$name.busy"
    local rtt_before
    rtt_before=$(rtt_ns)
    local before
    before=$(grep '^cpu ' /proc/stat)
    timeout "$timeout_s" "$@" >"$logs/$name.out" 2>&1
    local rc=$?
    steal_pct "$before" "$(grep '^cpu ' /proc/stat)" >"$logs/$name.steal"
    [ -n "$rtt_before" ] && echo "$rtt_before $(rtt_ns)" >"$logs/$name.rtt"
    echo "$rc" >"$logs/$name.rc"
    [ "$rc" -eq 0 ] || echo "#   $name: exit status $rc (see the report)"
    return 0
}

# Per rank count and collective, ferroccl's sweep and then Open MPI's, so that both see the host
# in the same state (other work on a shared host comes and goes); --repeat alternates the pair.
for n in "${nps[@]}"; do
    for coll in "${colls[@]}"; do
        for ((r = 0; r < repeat; r++)); do
            tag="$n-$coll-r$r"
            echo "# $coll, $n ranks$( [ "$repeat" -gt 1 ] && echo ", repeat $((r + 1))/$repeat"): ferroccl-bench, ompi_bench"
            wait_for_idle "$tag"
            # One sweep, logged as segment 0 (the report reads runs cut in segments too).
            run_logged "ferroccl-$tag-seg0" "${launch[@]}" -np "$n" "$fbench" "$coll" \
                -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" "${ftiers[@]}" "${fwarm[@]}" \
                -c "$check" "${fextra[@]}" -J "$logs/ferroccl-$tag-seg0.json"
            if [ "$both_allocs" = 1 ]; then
                run_logged "ferroccl_mem-$tag-seg0" "${launch[@]}" -np "$n" "$fbench" "$coll" \
                    -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" "${ftiers[@]}" "${fwarm[@]}" \
                    -c "$check" --alloc nccl -J "$logs/ferroccl_mem-$tag-seg0.json"
            fi
            run_logged "ompi-$tag" "${launch[@]}" -np "$n" "$obench" -C "$coll" \
                -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" "${ompi_tiers[@]}" "${owarm[@]}" \
                -c "$check" -J "$logs/ompi-$tag.json"
        done
    done
done
echo "ferroccl_tiers=${ftiers[*]}" >>"$logs/meta.txt"
echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$logs/meta.txt"

fi # not --report-from

# ---- report ----------------------------------------------------------------------------------
"$PYTHON" - "$logs" "$out" "${nps[*]}" "${colls[*]}" <<'PYEOF'
import json, os, sys

logs, out, nps = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split()]
COLLS = sys.argv[4].split()
MIB = 1 << 20

meta = {}
for line in open(os.path.join(logs, "meta.txt")):
    k, _, v = line.rstrip("\n").partition("=")
    meta[k] = v

def read(path):
    try:
        return open(path).read()
    except OSError:
        return ""

def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def fmt_size(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"

def tail(path):
    return "\n".join(read(path).splitlines()[-15:])

def best(cands):
    # The fastest of the repeats, per placement (oop and ip independently).
    cands = [c for c in cands if c]
    if not cands:
        return None
    return {p: min((c[p] for c in cands), key=lambda m: m["time_us"]) for p in ("oop", "ip")}

runs, failures = [], []

def record_run(base, label, busy, steal, rtt):
    """One program run's host busy and steal shares and CPU 0-1 round trips before and after
    (appended), and its failure, if it failed (to the failures, as `label: exit status ...` with
    the output's tail)."""
    busy.append(read(base + ".busy").strip())
    steal.append(read(base + ".steal").strip())
    rtt.append(read(base + ".rtt").strip())
    rc = read(base + ".rc").strip()
    if rc != "0":
        failures.append(f"{label}: exit status {rc or '?'}; output tail:\n{tail(base + '.out')}")
def segments(prog, tag, what):
    """One ferroccl-bench sweep's segments (prog-tag-seg0, 1, ...): their results, run headers,
    and host busy and steal shares and round trips; a failed segment goes to the failures."""
    res, headers, busy, steal, rtt = [], [], [], [], []
    k = 0
    while os.path.exists(os.path.join(logs, f"{prog}-{tag}-seg{k}.cmd")):
        base = os.path.join(logs, f"{prog}-{tag}-seg{k}")
        k += 1
        record_run(base, f"{what}, `{read(base + '.cmd').strip()}`)", busy, steal, rtt)
        j = load_json(base + ".json")
        if j:
            headers.append({k2: v for k2, v in j.items() if k2 != "results"})
            res += j.get("results", [])
    return res, headers, busy, steal, rtt
for n in nps:
    for coll in COLLS:
        reps = []
        r = 0
        while os.path.exists(os.path.join(logs, f"ompi-{n}-{coll}-r{r}.cmd")):
            tag = f"{n}-{coll}-r{r}"
            r += 1
            fres, fjson, busy, steal, rtt = segments("ferroccl", tag, f"ferroccl-bench {coll} at {n} ranks (repeat {r}")
            mseg = segments("ferroccl_mem", tag, f"ferroccl-bench --alloc nccl {coll} at {n} ranks (repeat {r}")
            mres = mseg[0]
            rtt += mseg[4]
            obase = os.path.join(logs, f"ompi-{tag}")
            record_run(obase, f"ompi_bench {coll} at {n} ranks (repeat {r})", busy, steal, rtt)
            oj = load_json(obase + ".json") or {}
            wt = read(os.path.join(logs, f"{tag}.wait")).split()
            reps.append({"wait_idle": {"result": wt[0], "waited_s": int(wt[1]), "busy_pct": int(wt[2])} if len(wt) == 3 else None,
                         "ferroccl": fres, "ferroccl_mem": mres, "ompi": oj.get("results", []), "ferroccl_runs": fjson,
                         "ompi_run": {k2: v for k2, v in oj.items() if k2 != "results"},
                         "host_busy_pct": [int(x) for x in busy if x],
                         "steal_pct": [int(x) for x in steal if x],
                         "rtt_ns": [[int(v) for v in x.split()] for x in rtt if x]})
        nrows = max([len(x["ferroccl"]) for x in reps] + [len(x["ompi"]) for x in reps] + [0])
        rows = []
        # Rows pair by position: both programs sweep the same requested sizes in the same order
        # (all_gather's size column is rounded, so two requested sizes can share a value).
        for i in range(nrows):
            fc = [x["ferroccl"][i] for x in reps if i < len(x["ferroccl"])]
            oc = [x["ompi"][i] for x in reps if i < len(x["ompi"])]
            ref = (fc or oc)[0]
            for c in fc + oc:
                if c["size"] != ref["size"]:
                    failures.append(f"{coll} at {n} ranks: row {i} sizes differ ({c['size']} vs {ref['size']})")
            mc = [x["ferroccl_mem"][i] for x in reps if i < len(x["ferroccl_mem"])]
            f, o, m = best(fc), best(oc), best(mc)
            if o:
                o["iters"], o["warmup_iters"] = oc[0].get("iters"), oc[0].get("warmup_iters")
            ratio = f["oop"]["busbw"] / o["oop"]["busbw"] if (f and o and o["oop"]["busbw"]) else None
            rows.append({
                "size": ref["size"], "count": ref["count"],
                "ferroccl": f, "ompi": o, "ferroccl_mem": m,
                "busbw_ratio": ratio,
                "malloc_over_mem_time": (f["oop"]["time_us"] / m["oop"]["time_us"])
                                        if (f and m and m["oop"]["time_us"]) else None,
                "busbw_ratio_ip": (f["ip"]["busbw"] / o["ip"]["busbw"]) if (f and o and o["ip"]["busbw"]) else None,
                "repeats": {"ferroccl_oop_time_us": [c["oop"]["time_us"] for c in fc],
                            "ompi_oop_time_us": [c["oop"]["time_us"] for c in oc],
                            "ferroccl_mem_oop_time_us": [c["oop"]["time_us"] for c in mc]},
            })
        runs.append({"nranks": n, "collective": coll, "rows": rows,
                     "host_busy_pct": [b for x in reps for b in x["host_busy_pct"]],
                     "steal_pct": [b for x in reps for b in x["steal_pct"]],
                     "rtt_ns": [b for x in reps for b in x["rtt_ns"]],
                     "wait_idle": [x["wait_idle"] for x in reps],
                     "ferroccl_runs": [x["ferroccl_runs"] for x in reps],
                     "ompi_runs": [x["ompi_run"] for x in reps]})

# ---- targets --------------------------------------------------------------------------------
targets = []
for n in nps:
    # No size below Open MPI's busbw, for every collective measured (issue 15).
    for run in (r for r in runs if r["nranks"] == n):
        rated = [r for r in run["rows"] if r["busbw_ratio"] is not None]
        if not rated:
            continue
        worst = min(rated, key=lambda r: r["busbw_ratio"])
        below = [fmt_size(r["size"]) for r in rated if r["busbw_ratio"] < 1.0]
        targets.append({
            "name": f"{run['collective']} busbw >= 1.0x Open MPI at every size, {n} ranks", "nranks": n,
            "status": "PASS" if not below else "MISS",
            "detail": f"worst ratio {worst['busbw_ratio']:.2f}x at {fmt_size(worst['size'])}"
                      + (f"; below 1.0x at {', '.join(below)}" if below else ""),
        })
    # Malloc'd buffers within 1.25x of ncclMemAlloc ones (issue 15), with --both-allocs.
    for run in (r for r in runs if r["nranks"] == n):
        paired = [r for r in run["rows"] if r["malloc_over_mem_time"] is not None and r["count"] > 0]
        if not paired:
            continue
        worst = max(paired, key=lambda r: r["malloc_over_mem_time"])
        over = [fmt_size(r["size"]) for r in paired if r["malloc_over_mem_time"] > 1.25]
        targets.append({
            "name": f"{run['collective']} malloc'd buffers within 1.25x of ncclMemAlloc's time at every size, {n} ranks",
            "nranks": n, "status": "PASS" if not over else "MISS",
            "detail": f"worst {worst['malloc_over_mem_time']:.2f}x at {fmt_size(worst['size'])}"
                      + (f"; above 1.25x at {', '.join(over)}" if over else ""),
        })
    ar = next((r for r in runs if r["nranks"] == n and r["collective"] == "all_reduce"), None)
    if ar is None:
        continue
    big = [r for r in ar["rows"] if r["size"] >= MIB]
    ok = bool(big) and all(r["busbw_ratio"] is not None and r["busbw_ratio"] >= 2.0 for r in big)
    worst = min((r for r in big if r["busbw_ratio"] is not None), key=lambda r: r["busbw_ratio"], default=None)
    targets.append({
        "name": f"all_reduce busbw >= 2x Open MPI for sizes >= 1 MiB, {n} ranks",
        "nranks": n, "status": "PASS" if ok else "MISS",
        "detail": (f"worst ratio {worst['busbw_ratio']:.2f}x at {fmt_size(worst['size'])}; "
                   f"{sum(1 for r in big if (r['busbw_ratio'] or 0) >= 2.0)}/{len(big)} sizes reach 2x")
                  if worst else "no rows >= 1 MiB",
    })
    r8 = next((r for r in ar["rows"] if r["size"] == 8), None)
    if r8 and r8["ferroccl"] and r8["ompi"]:
        ft, ot = r8["ferroccl"]["oop"]["time_us"], r8["ompi"]["oop"]["time_us"]
        targets.append({
            "name": f"all_reduce 8-byte latency <= Open MPI's, {n} ranks", "nranks": n,
            "status": "PASS" if ft <= ot else "MISS",
            "detail": f"ferroccl {ft:.2f} us vs Open MPI {ot:.2f} us ({ft / ot:.1f}x)" if ot else "",
        })
    else:
        targets.append({"name": f"all_reduce 8-byte latency <= Open MPI's, {n} ranks", "nranks": n,
                        "status": "MISS", "detail": "no 8-byte row (use --sizes 8:...)"})

# ---- tables ---------------------------------------------------------------------------------
def g(x, spec):
    return format(x, spec) if x is not None else "-"

lines = []
P = lines.append
P(f"# ferroccl vs Open MPI: {', '.join(COLLS)} on one host")
P("")
P(f"- Date: {meta.get('date')}")
P(f"- Command: `{meta.get('command_line')}`")
P(f"- Machine: {meta.get('host')}, {meta.get('cpu_model')}, {meta.get('cpus')} CPUs "
  f"({meta.get('sockets')} socket x {meta.get('cores_per_socket')} cores x {meta.get('threads_per_core')} threads), "
  f"{meta.get('memory')} memory, {meta.get('kernel')}")
P(f"- Load average at start / end: {meta.get('loadavg_start')} / {meta.get('loadavg_end')}")
P(f"- ferroccl: {meta.get('ferroccl_version')} ({meta.get('ferroccl_bench_version')}), "
  f"git {meta.get('git_commit')}; transport: {meta.get('ferroccl_transport') or 'unknown'}")
P(f"- ferroccl node area: {meta.get('ferroccl_node_area') or 'none'}; ferroccl-bench buffers from "
  f"{meta.get('ferroccl_buffers') or '?'}"
  + (" (and, in the columns marked ncclMemAlloc, a second run with ncclMemAlloc buffers)"
     if meta.get("both_allocs") == "1" else "")
  + ", ompi_bench buffers from malloc")
P(f"- Open MPI: {meta.get('ompi_version')} (default MCA settings: pml {meta.get('ompi_pml') or '?'}, "
  f"vader BTL single-copy mechanism {meta.get('ompi_vader_single_copy') or '?'}), "
  f"ompi_bench built with {meta.get('mpicc')}")
o0 = next((o for r in runs for o in r["ompi_runs"] if o), {})
cfg = o0.get("config", {})
P(f"- Launch (both): `mpirun -np N --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo`, "
  f"OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
if cfg:
    tiers = "".join(f", {t['iters']} + {t['warmup_iters']} from {fmt_size(t['from'])}" for t in cfg.get("tiers", []))
    P(f"- Iterations (both, timed + warm-up per size): {cfg.get('iters')} + {cfg.get('warmup_iters')}{tiers}; "
      f"{cfg.get('check')} checked call(s) per size, outside the timed loop; time = mean over ranks "
      "(nccl-tests -a 1)")
    if cfg.get("fresh_inputs"):
        P("- Inputs (both): each rank rewrites its input before every call, timed with the calls "
          "(--fresh-inputs), as an application with new data would")
    if cfg.get("arrays"):
        P("- Buffers (both): each size in send and receive arrays of its own, of exactly its bytes "
          "(--arrays), as a simulation code passes them")
    if cfg.get("unalign"):
        P(f"- Misaligned (both, -u {cfg['unalign']}): every buffer starts {cfg['unalign']} float(s), "
          f"{4 * cfg['unalign']} bytes, past where it would (an array section such as a(2:n))")
    P("- Warm-up (both): " + ("each size in its own arrays, right before it is timed" if cfg.get("arrays") else
      "a pass over all sizes, then each size right before it is timed "
      "(ferroccl-bench --warmup-each, ompi_bench --warmup-pass)" if cfg.get("warmup_pass") else
      "as nccl-tests for ferroccl-bench (one pass before the sweep), each size right before it is "
      "timed for ompi_bench (--nccl-tests-warmup)"))
rep = int(meta.get("repeat") or 1)
P(f"- Order: per rank count and collective, ferroccl-bench's sweep then ompi_bench's; "
  + (f"{rep} repeats alternating the two, each cell the fastest of the {rep} (all in the JSON)"
     if rep > 1 else "one run each, each cell one nccl-tests-style mean"))
if meta.get("wait_idle"):
    P(f"- Before each pair of sweeps the script waited for the host to be idle (below {meta['wait_idle']})")
P("- busbw as nccl-tests: algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather, size = total "
  "gathered bytes; reduce_scatter, size = total bytes each rank sends), x 1 (broadcast). Out-of-place columns; ratio = ferroccl busbw / Open MPI busbw "
  "(> 1: ferroccl faster). In-place numbers are in the JSON.")
P("")
P("## Targets (issue 5 section 4; issue 15: no size below Open MPI)")
P("")
for t in targets:
    P(f"- **{t['status']}** {t['name']}: {t['detail']}")
P("")
P("## Small-message latency (out-of-place, smallest non-empty size)")
P("")
P("| ranks | collective | size (B) | ferroccl (us) | Open MPI (us) | ferroccl / Open MPI |")
P("|---:|---|---:|---:|---:|---:|")
for r in runs:
    row = next((x for x in r["rows"] if x["count"] > 0), None)
    if not row:
        continue
    ft = row["ferroccl"]["oop"]["time_us"] if row["ferroccl"] else None
    ot = row["ompi"]["oop"]["time_us"] if row["ompi"] else None
    P(f"| {r['nranks']} | {r['collective']} | {row['size']} | {g(ft, '.2f')} | {g(ot, '.2f')} | "
      f"{g(ft / ot if ft is not None and ot else None, '.2f')} |")
P("")
for r in runs:
    P(f"## {r['collective']}, {r['nranks']} ranks")
    P("")
    bz = r["host_busy_pct"]
    if bz:
        P(f"CPU busy with other work in the half second before each of its runs (ferroccl segments, "
          f"then Open MPI): {', '.join(f'{x}%' for x in bz)}"
          + (f" -- {sum(1 for x in bz if x >= 20)} of {len(bz)} runs started on a busy host"
             + ("; each cell is the fastest of the repeats" if rep > 1 and min(bz) < 20
                else "; these numbers are disturbed") if max(bz) >= 20 else "")
          + "".join(f"; waited {w['waited_s']} s for an idle host" + (" and gave up" if w["result"] == "timeout" else "")
                    for w in r["wait_idle"] if w))
        P("")
    st = r.get("steal_pct") or []
    if st:
        P(f"CPU time stolen by the hypervisor during each run (same order): {', '.join(f'{x}%' for x in st)}"
          + (" -- runs with 10% or more were slowed by other guests" if max(st) >= 10 else ""))
        P("")
    rt = r.get("rtt_ns") or []
    if rt:
        P("Cache-line round trip between CPU 0 and CPU 1 before / after each run (ns; ferroccl segments, "
          "then ferroccl's ncclMemAlloc segments, then Open MPI): "
          + ", ".join("/".join(str(v) for v in x) for x in rt)
          + (" -- on a VM the host moves its vCPUs: data crossing between ranks every call (slots, "
             "small messages) runs several times slower in runs at several hundred ns "
             "(bench/results/vcpu-distance-2026-12-07.md)" if max(max(x) for x in rt) >= 2 * min(min(x) for x in rt) else ""))
        P("")
    mem = any(x["ferroccl_mem"] for x in r["rows"])
    P("| size (B) | ferroccl busbw (GB/s) | Open MPI busbw (GB/s) | ratio | ferroccl time (us) | Open MPI time (us) |"
      + (" ferroccl ncclMemAlloc time (us) | malloc'd / ncclMemAlloc time |" if mem else ""))
    P("|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if mem else ""))
    for x in r["rows"]:
        f, o, m = x["ferroccl"], x["ompi"], x["ferroccl_mem"]
        P(f"| {x['size']} | {g(f and f['oop']['busbw'], '.2f')} | {g(o and o['oop']['busbw'], '.2f')} | "
          f"{g(x['busbw_ratio'], '.2f')} | {g(f and f['oop']['time_us'], '.2f')} | {g(o and o['oop']['time_us'], '.2f')} |"
          + (f" {g(m and m['oop']['time_us'], '.2f')} | {g(x['malloc_over_mem_time'], '.2f')} |" if mem else ""))
    P("")
wrong = [(r["nranks"], r["collective"], x["size"], lib)
         for r in runs for x in r["rows"] for lib in ("ferroccl", "ompi")
         if x[lib] and any((x[lib][p]["wrong"] or 0) > 0 for p in ("oop", "ip"))]
if wrong:
    P("## Wrong results")
    P("")
    for w in wrong:
        P(f"- {w[3]} {w[1]} at {w[0]} ranks, {w[2]} B")
    P("")
if failures:
    P("## Failed runs")
    P("")
    for fl in failures:
        P("```")
        P(fl)
        P("```")
    P("")

P("## Notes")
P("")
P("- Open MPI's blocking MPI_Bcast (and the small all-gathers) return on the root as soon as an "
  "eager message is in the shared-memory FIFO, so back-to-back calls pipeline: its small-size "
  "broadcast time is an issue rate, not a one-way latency. ferroccl's host calls return when the "
  "rank's part of the collective is done.")
P("- More ranks than cores (4 on 2): every rank polls, so both libraries' numbers depend on how the "
  "kernel schedules them (Open MPI turns on mpi_yield_when_idle when it sees oversubscription).")
P("- Open MPI's vader BTL sends messages above its 4 KiB eager limit with one copy straight between "
  "the two processes' buffers (CMA, process_vm_readv) when single-copy is cma; a transport that "
  "stages data through shared FIFO slots touches it twice, which bounds pure data movement "
  "(broadcast, all_gather) at large sizes.")
P("- The host is shared with other work; the busy shares above say how much of it ran just before "
  "each run.")
P("")
md = "\n".join(lines)
with open(out + ".md", "w") as fh:
    fh.write(md)
with open(out + ".json", "w") as fh:
    json.dump({"program": "bench/compare_ompi.sh", "meta": meta, "targets": targets,
               "failures": failures, "runs": runs}, fh, indent=1)
print(md)
PYEOF
report_rc=$?
[ "$report_rc" -eq 0 ] || { echo "compare_ompi.sh: the report failed" >&2; exit 1; }

rm -f "$out.png"
# The plot needs matplotlib: if $PYTHON lacks it (a pyenv or venv interpreter, say) but the
# system's has it (Debian's python3-matplotlib), plot with that one.
plot_python=$PYTHON
if ! "$PYTHON" -c "import matplotlib" 2>/dev/null && [ -x /usr/bin/python3 ] \
    && /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
    plot_python=/usr/bin/python3
fi
"$plot_python" "$here/plot.py" "$out.json" "$out.png" || echo "# plot.py failed; no PNG"
echo "# wrote $out.md $out.json$( [ -f "$out.png" ] && echo " $out.png")"
exit 0
