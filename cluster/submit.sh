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
#   FEDSIM_VALIDATE   set to 0 to skip checking the scenario locally first.
#
# Exit status: that of `ray job submit` (0 when the job SUCCEEDED), or 2 for a
# usage error or an invalid scenario.
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
    *) die "$scenario is outside the repository ($root); only files inside it reach the cluster" ;;
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

job_opts=()
read -r -a job_opts <<<"${RAY_JOB_OPTS:-}"
cmd=("$RAY" job submit --address "$RAY_ADDRESS" --working-dir . --runtime-env cluster/runtime_env.yaml)
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
