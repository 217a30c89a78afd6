#!/usr/bin/env bash
# Checks that can fail, shown failing: each case below copies the repository's
# tracked files, breaks one thing a test checks (a one-line edit, stated
# below), runs that test on the copy and expects it to FAIL. A case whose
# test still passes means the test no longer checks what it claims.
#
#   bash tests/broken_copies.sh            # every case (about 16 min on 2 cores)
#   bash tests/broken_copies.sh stress gpu # some of them
#   BROKEN_DRY=1 bash tests/broken_copies.sh  # only: does each edit still apply?
#
# Prints one line per case ("caught" or "NOT CAUGHT", the test's assertion)
# and exits 1 if any case was not caught or its edit no longer applies (the
# line it breaks changed: update the case). Not part of `make test`: each case
# is a pytest run of its own, and the `retried`, `placement` and `per_node`
# cases each start the multi-node cluster. Issue 23 lists where each check
# came from; issue 39 the signal cases and link_weights to clock_floor; issue 46
# crn_round to stress_bytes.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d /tmp/fedsim-broken-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# Each copy is $WORK/NAME, so its ../shared is $WORK/shared: point that at this
# clone's ../shared, or the tests on the shared data (per_node) would skip on
# the copy, and a skip is not a failure.
if [ -d "$ROOT/../shared" ]; then
  ln -s "$(cd "$ROOT/../shared" && pwd)" "$WORK/shared"
fi
failures=0

# edit FILE OLD NEW: replace the one occurrence of OLD in FILE (in the copy).
edit() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import pathlib, sys
path, old, new = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
text = path.read_text()
if text.count(old) != 1:
    sys.exit(f"{path}: the line to break occurs {text.count(old)} times, not once")
path.write_text(text.replace(old, new))
EOF
}

# case NAME TESTS FILE OLD NEW [CWD]: break FILE (OLD -> NEW) in a copy, run
# TESTS there (from CWD, default the copy's root), expect a failure.
case_() {
  local name=$1 tests=$2 file=$3 old=$4 new=$5 cwd=${6:-}
  local copy=$WORK/$name
  if [ -n "${BROKEN_DRY:-}" ]; then
    # only whether the edit still applies (its line unchanged), in seconds:
    # tests/test_broken_copies.py runs this on every case
    if "$PY" -c 'import pathlib, sys; sys.exit(pathlib.Path(sys.argv[1]).read_text().count(sys.argv[2]) != 1)' "$file" "$old"; then
      echo "$name: applies"
    else
      echo "$name: EDIT NO LONGER APPLIES ($file)"
      failures=$((failures + 1))
    fi
    return
  fi
  mkdir -p "$copy"
  git ls-files -z | xargs -0 cp --parents -t "$copy"
  if ! (cd "$copy" && edit "$file" "$old" "$new"); then
    echo "$name: EDIT NO LONGER APPLIES ($file)"
    failures=$((failures + 1))
    return
  fi
  local ids=() t
  for t in $tests; do ids+=("$copy/$t"); done
  (cd "${cwd:-$copy}" && PYTHONPATH=$copy "$PY" -m pytest -q -x -rs -p no:cacheprovider \
    --rootdir "$copy" -c "$copy/pyproject.toml" -o addopts="" "${ids[@]}") \
    > "$WORK/$name.log" 2>&1
  local rc=$? why
  why=$(grep -m1 -E "^E  +[A-Za-z_.]*(Error|assert)" "$WORK/$name.log" | cut -c1-160)
  if [ "$rc" -eq 1 ]; then
    echo "$name: caught ($tests): $why"
  elif grep -qE "^[0-9]+ skipped" "$WORK/$name.log"; then
    # nothing ran: a skip would otherwise read as a test that passed
    echo "$name: NOT RUN (its test skipped, $tests): $(grep -m1 SKIPPED "$WORK/$name.log")"
    failures=$((failures + 1))
  else
    echo "$name: NOT CAUGHT (pytest exit $rc, $tests)"
    tail -5 "$WORK/$name.log"
    failures=$((failures + 1))
  fi
  rm -rf "$copy"
}

run() {
  case $1 in
  stress) # tau_std as the sample std, not the kept taus' std the test recomputes
    case_ stress tests/test_stress.py::test_stress_report_on_a_ci_sized_grid \
      fedsim/tools/stress.py '"tau_std": float(taus.std())' '"tau_std": float(taus.std(ddof=1))' ;;
  bias) # the participation-bias L1 halved (a total-variation slip)
    case_ bias tests/test_participation_bias.py fedsim/algorithms/sampling.py \
      '"l1": float(np.abs(over).sum())' '"l1": float(np.abs(over).sum() / 2)' ;;
  figure_compare) # compare.png drawn with no series
    case_ figure_compare tests/test_runtime.py::test_compare_runs_an_async_scenario \
      fedsim/tools/compare.py '            _draw_band(ax, mine, (x_key, y_key), color, label)' \
      '            pass  # broken copy: no series drawn' ;;
  figure_degradation) # degradation.png drawn with no series
    case_ figure_degradation tests/test_stress.py::test_stress_report_on_a_ci_sized_grid \
      fedsim/tools/stress.py '        ax.plot(xs, d["accuracy"], marker="o", color=c, label=d["algorithm"])
        ax.fill_between(xs, lows, highs, color=c, alpha=0.15)' \
      '        continue  # broken copy: no series drawn' ;;
  figure_shares) # weight_share.png without its clients
    case_ figure_shares tests/test_participation_bias.py::test_summary_json_and_report_show_the_meter \
      fedsim/tools/plots.py 'ax.scatter(data, y, s=14' 'ax.scatter(data[:0], y[:0], s=14' ;;
  cli_loc) # exit 2 still, but the message no longer names the field
    case_ cli_loc tests/test_cli.py::test_invalid_scenarios_exit_2_without_traceback \
      fedsim/scenario.py '    return out or "(top level)"' '    return "(top level)"' ;;
  pairing) # the loop's old relative path, pytest started outside the repository
    case_ pairing tests/test_pairing.py::test_every_shipped_scenario_still_loads \
      tests/test_pairing.py "    from .conftest import SCENARIOS  # absolute: whatever pytest's directory" \
      '    from pathlib import Path; SCENARIOS = Path("scenarios")  # the old relative path' /tmp ;;
  fuzz_share) # every run refused (exit 2, which the property alone accepts)
    case_ fuzz_share tests/test_fuzz_runtime.py::test_odd_scenarios_end_well_and_in_time \
      fedsim/tools/preflight.py '    check_model_data(facts, source)
    check_numeric_ranges' '    raise _error(f"{source}: rounds: refused by a broken copy")
    check_numeric_ranges' ;;
  gpu) # no CUDA here: the GPU tests run anyway, so the worker falls back to the CPU
    case_ gpu "tests/test_gpu.py::test_a_worker_trains_on_cuda_and_returns_its_update_on_the_cpu tests/test_gpu.py::test_in_float64_a_gpu_worker_equals_the_cpu_worker[fedavg-logreg-sequential]" \
      tests/test_gpu.py 'pytest.mark.skipif(not torch.cuda.is_available(), reason=' \
      'pytest.mark.skipif(False, reason=' ;;
  fmnist) # a learning rate that cannot learn: accuracy stays at chance
    case_ fmnist tests/test_data_fmnist_training.py tests/test_data_fmnist_training.py \
      '[f"rounds={ROUNDS}"]' '[f"rounds={ROUNDS}", "client.lr=1e-9"]' ;;
  retried) # a lost node's resent calls not counted
    case_ retried tests/test_multinode.py::test_a_node_lost_in_a_sync_run_changes_nothing \
      fedsim/remote/executor.py 'self.tasks_retried += len(calls[k].positions)' 'self.tasks_retried += 0' ;;
  partition) # the run draws partition.png again (the report's figure)
    case_ partition tests/test_report.py::test_a_run_without_report_draws_nothing_and_the_report_draws_the_partition \
      fedsim/runtime.py '                write_arrow(run_dir / "partition.parquet", table)' \
      '                write_arrow(run_dir / "partition.parquet", table)
                from fedsim.data.partition import plot_partition
                plot_partition(table, run_dir / "partition.png")' ;;
  placement) # every placement group packed, strict_spread's included
    case_ placement tests/test_multinode.py::test_workers_are_placed_as_the_scenario_says \
      fedsim/remote/placement.py 'ray.util.placement_group(bundles, res.placement.upper())' \
      'ray.util.placement_group(bundles, "PACK")' ;;
  per_node) # per-node data not checked before the actors start
    case_ per_node tests/test_multinode.py::test_per_node_data_is_checked_on_every_node \
      fedsim/remote/executor.py '            check_data_on_nodes(setup.recipe)' '            pass' ;;
  restart) # a restarting actor given only the count of attempts, as before
    case_ restart tests/test_faults.py::test_killed_worker_is_replaced_and_results_are_identical \
      fedsim/remote/actors.py 'return delay if attempts.waited_s < self.restart_wait_s else None' \
      'return delay if attempts.failures < self.max_deaths else None' ;;
  interrupt) # the round loop never looks for a signal its handler noted
    case_ interrupt tests/test_interrupts.py::test_a_signal_a_finalizer_would_swallow_still_stops_the_run \
      fedsim/runtime.py '        interrupts.before_round()  # a Ctrl-C during the last round stops here' \
      '        pass  # broken copy' ;;
  sigterm_ray) # ray.init's SIGTERM handler left in place
    case_ sigterm_ray tests/test_loopback.py \
      fedsim/remote/ray_session.py '    with interrupts.kept(), _signals_wait_for_the_start():' \
      '    with open(os.devnull):' ;;
  sigterm_ray_start) # Ray's handlers (Python's and C++'s) installed during its start
    case_ sigterm_ray_start tests/test_robustness.py::test_a_sigterm_inside_rays_start_is_an_interrupted_set_up \
      fedsim/remote/ray_session.py '    if not interrupts.installed():' '    if True:' ;;
  sigterm_grace) # a first SIGTERM waits for a stuck round for ever
    case_ sigterm_grace tests/test_interrupts.py::test_one_sigterm_ends_a_round_that_never_ends_after_its_grace \
      fedsim/interrupts.py '    _thread.interrupt_main(signal.SIGTERM)' '    pass  # broken copy' ;;
  link_weights) # after linking, the weights not moved with the data
    case_ link_weights tests/test_links.py::test_summary_and_report_state_the_realised_links \
      fedsim/links.py '    return _with_rows(data, rows, offsets, np.asarray(data.weights)[perm])' \
      '    return _with_rows(data, rows, offsets, np.asarray(data.weights))' ;;
  server_order) # the server actor applies a version's updates sorted by client
    case_ server_order tests/test_server_actor.py::test_asynchronous_runs_are_identical_in_both_homes \
      fedsim/remote/server_actor.py '        return self.apply(ups, at)' \
      '        return self.apply(sorted(ups, key=lambda u: u.client), at)' ;;
  resume_other) # a checkpoint resumed whatever the scenario now says
    case_ resume_other tests/test_robustness.py::test_resuming_another_experiment_is_refused_naming_each_field \
      fedsim/checkpoint.py '    if diffs:' '    if False:' ;;
  clock_floor) # a fixed window's steps rounded, not floored
    case_ clock_floor tests/test_clock_steps.py::test_a_window_with_a_fractional_step_count_floors_it \
      fedsim/clock.py '    return np.floor(steps + _EPS * np.maximum(1.0, steps))' \
      '    return np.round(steps + _EPS * np.maximum(1.0, steps))' ;;
  crn) # a round's device draws keyed by position in the cohort, as before issue 36
    case_ crn tests/test_crn.py::test_a_device_behaves_alike_whichever_selector_chose_it \
      fedsim/fleet/devices.py 'np.uint64(stream_key(self.seed, TAG_ROUND)) ^ idx.astype(np.uint64)' \
      'np.uint64(stream_key(self.seed, TAG_ROUND)) ^ np.arange(idx.size, dtype=np.uint64)' ;;
  crn_round) # a device's round draws keyed by (seed, device), the round left out
    case_ crn_round tests/test_crn.py \
      fedsim/fleet/devices.py 'cell = splitmix64(key ^ np.uint64(t))' 'cell = splitmix64(key)' ;;
  paired_direction) # every paired metric read as higher-is-better
    case_ paired_direction tests/test_paired_direction.py fedsim/tools/compare.py \
      'iv = decide(diffs, higher_is_better=m.higher_is_better)' \
      'iv = decide(diffs, higher_is_better=True)' ;;
  flops_batch) # the batch size left out of the FLOP count's cache key
    case_ flops_batch tests/test_flops.py::test_the_count_follows_the_batch_size_alone \
      fedsim/flops.py '        num_classes,
        batch_size,
        integer_inputs,' '        num_classes,
        integer_inputs,' ;;
  realised_dropout) # the dropout rate over every selected update, not those started
    case_ realised_dropout tests/test_realised.py::test_the_dropout_rate_counts_the_updates_whose_work_started \
      fedsim/realised.py '_rate(reasons.count("dropout"), started, s.dropout_p)' \
      '_rate(reasons.count("dropout"), n, s.dropout_p)' ;;
  flops_quantiles) # a FLOP/s group's declared quantiles left in FLOP/s
    case_ flops_quantiles tests/test_realised.py::test_a_flops_groups_declared_quantiles_are_in_steps_per_s \
      fedsim/realised.py 'per = flops if speed.per_flop and flops else 1.0' 'per = 1.0' ;;
  mlflow_failed) # a run that did not complete recorded in MLflow as FINISHED
    case_ mlflow_failed tests/test_tracking.py::test_a_failed_run_ends_its_mlflow_run_as_failed \
      fedsim/tools/tracking.py '.get(status, "FAILED")' '.get(status, "FINISHED")' ;;
  mlflow_resume) # a resume that starts a new MLflow run instead of continuing its own
    case_ mlflow_resume tests/test_tracking.py::test_a_resume_logs_into_the_runs_it_started_each_round_once \
      fedsim/tools/tracking.py 'old = keep.read_text().strip() if keep.exists() else None' \
      'old = None' ;;
  fused_clip) # the fused batched step (no weight decay, no hook) skips the clip
    case_ fused_clip tests/test_batched_clip.py::test_a_clipped_plain_rule_without_weight_decay_is_clipped_and_equal \
      fedsim/batched.py '    if layers and fused and clip is None:' '    if layers and fused:' ;;
  dropout_draws) # a round's dropout drawn from the straggler's uniforms
    case_ dropout_draws tests/test_fleet_realistic.py::test_dropouts_and_stragglers_are_independent_draws \
      fedsim/fleet/devices.py 'dropout=u[:, 3:5]' 'dropout=u[:, 0:2]' ;;
  dropout_draws_clock) # the same, the clock handing the straggler's uniforms over
    case_ dropout_draws_clock tests/test_fleet_realistic.py::test_dropouts_and_stragglers_are_independent_draws \
      fedsim/clock.py 'fleet.draw_dropouts(ids, draws.dropout, work_s)' \
      'fleet.draw_dropouts(ids, draws.slowdown, work_s)' ;;
  fedexp_eta) # FedExP's step size a third smaller (still >= 1: the old check held)
    case_ fedexp_eta tests/test_hooks.py::test_fedexp_reports_its_step_size_as_a_column_and_a_figure \
      examples/fedsim_example/fedsim_example/fedexp.py 'spread / (2.0 * (' 'spread / (3.0 * (' ;;
  plugin_figure) # plugin_metrics.png drawn with no series (its size alone passed)
    case_ plugin_figure tests/test_hooks.py::test_fedexp_reports_its_step_size_as_a_column_and_a_figure \
      fedsim/tools/plots.py '_line(ax, x, _floats(rounds, col, len(x)), color="C2")' \
      '_line(ax, x[:0], _floats(rounds, col, len(x))[:0], color="C2")' ;;
  tracker_once) # a resume sends its trackers the rounds they hold already
    case_ tracker_once tests/test_tracking.py::test_a_resume_logs_into_the_runs_it_started_each_round_once \
      fedsim/tools/tracking.py '            if step > sink.logged:' '            if True:' ;;
  mlflow_check) # the MLflow store not checked before the run
    case_ mlflow_check tests/test_tracking.py::test_an_mlflow_store_that_cannot_be_used_is_refused_before_training \
      fedsim/tools/tracking.py '        check_mlflow()' '        pass' ;;
  tensorboard_file) # a file where tensorboard/ goes found only when the writer starts
    case_ tensorboard_file tests/test_tracking.py::test_a_file_where_the_tensorboard_folder_goes_is_refused_before_training \
      fedsim/tools/tracking.py '        _check_event_folder(folder / "tensorboard")' '        pass' ;;
  stress_bytes) # stress's runs without their per-round bytes
    case_ stress_bytes tests/test_tracking.py::test_stress_logs_the_bytes_down_and_up_of_every_round \
      fedsim/tools/stress.py 'rows = with_round_bytes(result.rows, result.clients)' 'rows = result.rows' ;;
  *) echo "unknown case: $1"; failures=$((failures + 1)) ;;
  esac
}

ALL="crn stress bias figure_compare figure_degradation figure_shares cli_loc pairing fuzz_share gpu fmnist retried partition placement per_node restart interrupt sigterm_ray sigterm_ray_start sigterm_grace link_weights server_order resume_other clock_floor crn_round paired_direction flops_batch realised_dropout flops_quantiles mlflow_failed mlflow_resume fused_clip dropout_draws dropout_draws_clock fedexp_eta plugin_figure tracker_once mlflow_check tensorboard_file stress_bytes"
for c in ${@:-$ALL}; do run "$c"; done
[ "$failures" -eq 0 ]
