#!/usr/bin/env bash
# Run a fedsim scenario on a Ray cluster as a Ray job.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 cluster/submit.sh scenarios/quickstart.yaml --set rounds=100
#
# Everything after SCENARIO goes to `fedsim run`. This script runs
#
#   ray job submit --address "$RAY_ADDRESS" --working-dir . \
#       --runtime-env cluster/runtime_env.yaml -- fedsim run SCENARIO ... --out DIR
#
# from the repository root, so the checkout you submit from (minus results/,
# .venv and what .gitignore lists) is the code that runs. The driver runs on
# the cluster's head node and writes the run directory there, at --out:
#
#   - pass `--out /shared/path/run1` to write to storage every node mounts
#     (EFS on AWS, a PersistentVolumeClaim on Kubernetes), or
#   - let this script choose $FEDSIM_RESULTS/<scenario>-<UTC time>
#     (FEDSIM_RESULTS defaults to /home/ray/fedsim-results on the head node).
#
# A relative --out would land in the job's temporary copy of the working
# directory, which Ray deletes, so it is refused. The script prints where the
# results are and how to copy them back when the job ends.
#
# Environment:
#   RAY_ADDRESS       the cluster's dashboard (job server) URL, required
#                     (e.g. after `ray dashboard cluster/aws.yaml`, or a
#                     `kubectl port-forward` to the head service's port 8265).
#   RAY_AUTH_MODE     defaults to "token". The token comes from RAY_AUTH_TOKEN,
#                     RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, in that order.
#   FEDSIM_RESULTS    results root on the head node when --out is not given.
#   RAY               the ray CLI to use (default: `ray` on PATH).
#   RAY_JOB_OPTS      extra `ray job submit` options, e.g. "--no-wait" or
#                     "--submission-id fedsim-run1".
#   FEDSIM_PY_MODULES your own plug-in packages to ship with the job, as
#                     folders (the ones holding __init__.py) separated by ':',
#                     e.g. examples/fedsim_example/fedsim_example. Ray uploads
#                     each and puts it on the path of the driver and of every
#                     worker (runtime_env py_modules); the local check below
#                     finds them too. Name plug-ins by import path then
#                     (module:Class): entry points need the package installed.
#   FEDSIM_VALIDATE   set to 0 to skip checking the scenario locally first.
#   FEDSIM_CHECK_HEAD set to 0 to skip the check job (below).
#   FEDSIM_AGENT_WAIT_S  how long to wait for the head's job agent (default 120);
#   FEDSIM_AGENT_POLL_S  how often to ask meanwhile (default every 2 s).
#
# Before submitting, a tiny check job (no upload, a second or two) runs
# `command -v fedsim` on the head node and is then deleted. It waits, up to
# FEDSIM_AGENT_WAIT_S, while the job server answers "No available agent to
# submit job" (the first seconds after `ray start --head`) or cannot be
# reached, and stops with a clear message if the head has no `fedsim` command
# on its PATH (the job itself would die with "fedsim: not found", exit 127).
#
# Exit status: that of `ray job submit` (0 when the job SUCCEEDED), 2 for a
# usage error, an invalid scenario or a head without fedsim, 3 when the job
# server did not take a job within FEDSIM_AGENT_WAIT_S.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

die() {
    echo "submit.sh: $*" >&2
    exit 2
}

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
    usage
    [[ $# -ge 1 ]] && exit 0 || exit 2
fi

[[ -n ${RAY_ADDRESS:-} ]] || die "set RAY_ADDRESS to the cluster's dashboard URL, e.g. http://127.0.0.1:8265"
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
RAY=${RAY:-ray}
command -v "$RAY" >/dev/null || die "no ray CLI ('$RAY'); install ray[default] or set RAY"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
scenario=$1
shift
[[ -f $scenario ]] || die "no such scenario file: $scenario"

# The job runs in an unpacked copy of the repository, so name the scenario by
# its path inside the repository.
abs="$(cd "$(dirname "$scenario")" && pwd -P)/$(basename "$scenario")"
case $abs in
    "$root"/*) rel=${abs#"$root"/} ;;
    *) die "$scenario is outside the repository ($root); only files inside it reach the cluster. From your own package's folder, submit it with: ray job submit --working-dir . -- fedsim run ... (docs/extending.md, \"Submitting from your own package\")" ;;
esac
case $rel in
    results/* | .venv/*) die "$rel is excluded from the upload (cluster/runtime_env.yaml); copy it under scenarios/" ;;
esac

out=""
local_check=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --out) out=${args[i + 1]:-} ;;
        --out=*) out=${args[i]#--out=} ;;
        --set | --seed) local_check+=("${args[i]}" "${args[i + 1]:-}") ;;
        --set=* | --seed=*) local_check+=("${args[i]}") ;;
    esac
done
if [[ -z $out ]]; then
    stem=$(basename "$rel")
    stem=${stem%.yaml}
    stem=${stem%.yml}
    out="${FEDSIM_RESULTS:-/home/ray/fedsim-results}/${stem}-$(date -u +%Y%m%d-%H%M%S)"
    args+=(--out "$out")
fi
[[ $out == /* ]] || die "--out must be an absolute path on the cluster (got '$out'); a relative one lands in the job's temporary working directory"

cd "$root"
runtime_env=cluster/runtime_env.yaml
if [[ -n ${FEDSIM_PY_MODULES:-} ]]; then
    # cluster/runtime_env.yaml plus a py_modules list, in a file of our own
    # (removed on exit), so that the shipped settings stay the one source.
    runtime_env=$(mktemp --suffix=.yaml)
    trap 'rm -f "$runtime_env"' EXIT
    { cat cluster/runtime_env.yaml; echo; echo "py_modules:"; } >"$runtime_env"
    IFS=: read -r -a modules <<<"$FEDSIM_PY_MODULES"
    for m in "${modules[@]}"; do
        [[ -f $m/__init__.py ]] || die "FEDSIM_PY_MODULES: $m is not a package folder (no $m/__init__.py)"
        printf '  - "%s"\n' "$(cd "$m" && pwd -P)" >>"$runtime_env"
        # the local check imports the plug-ins from their parent folders
        PYTHONPATH="$(cd "$m/.." && pwd -P)${PYTHONPATH:+:$PYTHONPATH}"
    done
    export PYTHONPATH
fi
if [[ ${FEDSIM_VALIDATE:-1} != 0 ]] && command -v fedsim >/dev/null; then
    # `fedsim validate` takes no --seed; check only the file and its --set overrides.
    check=()
    for ((i = 0; i < ${#local_check[@]}; i++)); do
        case ${local_check[i]} in
            --seed) i=$((i + 1)) ;;
            --seed=*) ;;
            *) check+=("${local_check[i]}") ;;
        esac
    done
    fedsim validate "$rel" ${check[@]+"${check[@]}"} >/dev/null || exit 2
fi

# The check job: is the job agent up, and does the head have `fedsim`?
check_head() {
    local wait_s=${FEDSIM_AGENT_WAIT_S:-120} start=$SECONDS attempt=0 said=0
    local id out status
    # Single quotes: the head's shell expands this, not ours.
    # shellcheck disable=SC2016
    local probe='echo "fedsim-check: $(command -v fedsim || echo MISSING) PATH=$PATH"'
    while true; do
        attempt=$((attempt + 1))
        id="fedsim-check-$(date -u +%Y%m%d-%H%M%S)-$$-$attempt"
        status=0
        out=$("$RAY" job submit --address "$RAY_ADDRESS" --submission-id "$id" \
            -- sh -c "$probe" 2>&1) || status=$?
        case $out in
            *"No available agent"* | *"onnection refused"* | *"Failed to connect"* | *"Cannot connect"*) ;;
            *) break ;;
        esac
        if ((SECONDS - start >= wait_s)); then
            printf '%s\n' "$out" | tail -n 5 >&2
            echo "submit.sh: the job server at $RAY_ADDRESS took no job within ${wait_s}s (FEDSIM_AGENT_WAIT_S); is the head up? On the head: ray status, and its dashboard_agent.log (e.g. the agent's port, --dashboard-agent-listen-port, 52365 by default, taken by another Ray on that machine)" >&2
            exit 3
        fi
        if ((said == 0)); then
            echo "submit.sh: waiting up to ${wait_s}s for the head's job agent (it starts a few seconds after \`ray start --head\`) ..." >&2
            said=1
        fi
        sleep "${FEDSIM_AGENT_POLL_S:-2}"
    done
    # A finished check job is just clutter in `ray job list`.
    "$RAY" job delete --address "$RAY_ADDRESS" "$id" >/dev/null 2>&1 || true
    case $out in
        *"fedsim-check: /"*)
            return 0
            ;;
        *"fedsim-check: MISSING"*)
            printf '%s\n' "$out" | grep -m1 'fedsim-check:' >&2 || true
            die "the head node has no \`fedsim\` command on its PATH, so the job would die with 'fedsim: not found' (exit 127). Install fedsim where the head's \`ray start\` runs (pip install -e . in the environment whose ray started the head; cluster/README.md, 'What the nodes need') and restart Ray there."
            ;;
    esac
    if ((status != 0)); then
        printf '%s\n' "$out" | tail -n 20 >&2
        echo "submit.sh: the check job was refused or failed (status $status); see above" >&2
        exit "$status"
    fi
    # Some other ray CLI (e.g. RAY=echo in tests): nothing to conclude.
    echo "submit.sh: could not check the head node for fedsim; submitting anyway" >&2
}
if [[ ${FEDSIM_CHECK_HEAD:-1} != 0 ]]; then
    check_head
fi

job_opts=()
read -r -a job_opts <<<"${RAY_JOB_OPTS:-}"
cmd=("$RAY" job submit --address "$RAY_ADDRESS" --working-dir . --runtime-env "$runtime_env")
cmd+=(${job_opts[@]+"${job_opts[@]}"} -- fedsim run "$rel" ${args[@]+"${args[@]}"})
echo "submit.sh: results will be written on the head node to $out" >&2
echo "submit.sh: running: ${cmd[*]}" >&2

status=0
"${cmd[@]}" || status=$?

cat >&2 <<EOF

submit.sh: \`ray job submit\` exited with status $status.
submit.sh: results: $out (on the head node; a shared mount if you chose one). Copy them back with
  ray rsync-down cluster/aws.yaml '$out' results/                    # Ray cluster launcher
  kubectl cp "\$(kubectl get pod -l ray.io/node-type=head -o name | head -1 | cut -d/ -f2)":'$out' results/$(basename "$out")   # KubeRay
EOF
exit "$status"
