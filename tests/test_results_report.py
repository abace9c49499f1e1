"""docs/RESULTS.md's generated parts added by issues 30/31: the stack line of every table and the table of
ours beside a paper's values (experiments/report.py)."""

import json
import tomllib

from experiments.report import (at_round, check_line, fixed_round_tables, mark_stopped, paper_table, stacks_line,
                                stopping_rounds)
from flcore.stack import describe
from server_app.results import recorded_target, summarize


def _doc(gfl, pfl, stack=None):
    return {"final": {"global_accuracy": gfl, "local_accuracy": pfl}, "stack": stack}


STACK = {"python": "3.11.7", "packages": {"torch": "2.14.1"}, "lock": {"matches": True, "digest": "d1"},
         "git": {"commit": "f" * 40, "dirty": False}}


def test_stacks_line_counts_runs_per_stack():
    runs = {"a": [_doc(0.5, 0.6, STACK), _doc(0.5, 0.6, STACK)], "b": [_doc(0.5, 0.6)]}
    line = stacks_line(runs)
    assert line == (f"Stack: {describe(STACK)} (2 runs); {describe(None)} (1 run).")
    assert line == ("Stack: python 3.11.7, torch 2.14.1, the lock (d1), commit ffffffffff (2 runs); stack not recorded "
                    "(result written before results named their stack) (1 run).")  # as before the code digest


def test_stacks_line_names_the_code_that_ran():
    """A run that records its code digest (on the lent GPU machine: a copy of one commit's tree beside another
    commit's .git) is told apart from the older runs of the same commit, which render as before."""
    coded = {**STACK, "git": {**STACK["git"], "dirty": True, "code_dirty": True},
             "code": {"digest": "4d643635a26aacd3", "files": 187}}
    line = stacks_line({"a": [_doc(0.5, 0.6, coded)], "b": [_doc(0.5, 0.6, STACK)]})
    assert line == ("Stack: python 3.11.7, torch 2.14.1, the lock (d1), commit ffffffffff (1 run); "
                    "python 3.11.7, torch 2.14.1, the lock (d1), commit ffffffffff (dirty tree), "
                    "code 4d643635a26aacd3 (not the commit's code) (1 run).")


def test_paper_table_sets_ours_beside_the_papers_values():
    runs = {"fedavg": [_doc(0.70, None), _doc(0.80, None)], "fedrane": [_doc(0.9, 0.95)]}
    paper = {"source": "Table 1", "g-fl": {"fedavg": 0.7902, "fedrane": 0.8892}, "p-fl": {"fedrane": 0.9797}}
    lines = paper_table(runs, ["fedrane", "fedavg"], paper).splitlines()
    assert lines[0] == "Beside the paper (Table 1):"
    assert lines[4] == "| fedrane | 1 | 90.00 | 88.92 | 95.00 | 97.97 |"
    assert lines[5] == "| fedavg | 2 | 75.00 ± 7.07 | 79.02 | – | - |"
    assert paper_table(runs, [], {}) == ""
    paper["g-fl-std"] = {"fedavg": 0.0043}     # the paper's std, where its table prints one
    assert paper_table(runs, ["fedrane", "fedavg"], paper).splitlines()[5] == "| fedavg | 2 | 75.00 ± 7.07 | 79.02 ± 0.43 | – | - |"


def _run(label_seed: int, accs: list[float], secs: float = 2.0) -> dict:
    rounds = [{"round": i + 1, "global_accuracy": a, "global_loss": 1.0 - a, "local_accuracy": a + 0.1,
               "wall_time_s": secs, "bytes_sent": 100, "bytes_received": 100, "num_sampled": 2, "num_updates": 2,
               "num_failures": 0, "failures": []} for i, a in enumerate(accs)]
    rc = {"seed": label_seed, "num-server-rounds": 20, "target-accuracy": 0.5}
    return {"run_config": rc, "rounds": rounds, "final": summarize(rounds, recorded_target(rc), 4)}


def test_summarize_is_the_writers_final_and_reads_a_prefix():
    doc = _run(0, [0.2, 0.6, 0.4, 0.9])
    first3 = summarize(doc["rounds"][:3], recorded_target(doc["run_config"]), 4)
    assert first3["global_accuracy"] == 0.4 and first3["best_global_accuracy"] == 0.6
    assert first3["rounds"] == 3 and first3["rounds_to_target"] == 2 and first3["total_wall_time_s"] == 6.0
    assert doc["final"]["global_accuracy"] == 0.9 and doc["final"]["rounds"] == 4
    assert summarize([], 0.5) == {}
    assert first3["target_accuracy"] == 0.5


def test_a_record_without_target_accuracy_reads_the_declared_default():
    """The rounds-to-target default has one home, the declaration (flcore/common.py): a recorded run config
    without the key reads it, and the writer takes the parsed config's value."""
    from flcore.common import CommonConfig
    from flcore.config import RunConfig

    declared = CommonConfig.default_of("target-accuracy")
    assert declared == CommonConfig().target_accuracy == RunConfig.from_dict({}).target_accuracy == 0.8
    assert recorded_target({}) == declared and recorded_target({"target-accuracy": 0.3}) == 0.3
    rounds = _run(0, [0.2, 0.85])["rounds"]
    assert summarize(rounds, recorded_target({}))["rounds_to_target"] == 2
    assert summarize(rounds, recorded_target({}))["target_accuracy"] == declared


def test_at_round_cuts_every_run_that_reached_it_and_names_the_others():
    runs = {"fedavg": [_run(0, [0.2, 0.6, 0.7]), _run(1, [0.3, 0.5, 0.8, 0.85])],
            "slow": [_run(0, [0.1], secs=300.0)]}
    cut, short = at_round(runs, 2)
    assert list(cut) == ["fedavg"]
    assert [d["final"]["global_accuracy"] for d in cut["fedavg"]] == [0.6, 0.5]
    assert all(len(d["rounds"]) == 2 for d in cut["fedavg"])
    assert short == ["slow (seed 0): 1 round(s), 300 s/round"]
    lines = fixed_round_tables(runs, ["fedavg", "slow"], {}, [1, 3], "note")
    text = "\n".join(lines)
    assert text.startswith("note") and "**Read at round 1** (every run's first 1 rounds; every run reached it)" in text
    assert "| slow | 1 | 1 | 10.00 |" in text  # read at round 1, the slow run is in
    assert "fedavg (seed 0)" not in text and "slow (seed 0): 1 round(s), 300 s/round" in text
    assert "| fedavg | 2 | 3 | 75.00 ± 7.07 |" in text  # at round 3: both seeds, seed 1 cut from 4 rounds


def test_stopping_rounds_and_marking_an_experiment_stopped_by_a_deadline(tmp_path):
    runs = {"fast": [_run(0, [0.1] * 12), _run(1, [0.1] * 20)], "slow": [_run(0, [0.1] * 3)],
            "slowest": [_run(0, [0.1])], "none": [_run(0, [])]}
    assert stopping_rounds(runs) == [1, 3, 12]
    assert stopping_rounds(runs, most=2) == [1, 3]
    assert stopping_rounds({"done": [_run(0, [0.1] * 20)]}) == []
    exp = tmp_path / "exp"
    for label, docs in runs.items():
        for d in docs:
            seed_dir = exp / label / f"seed{d['run_config']['seed']}"
            seed_dir.mkdir(parents=True)
            (seed_dir / "results.json").write_text(json.dumps(d))
    (exp / "experiment.toml").write_text('[experiment]\nname = "exp"\nreport-rounds = [9]\n[runs.fast]\nmethod = "fedavg"\n')
    assert mark_stopped(exp, 'stopped by a "deadline"') == [1, 3, 12]
    doc = tomllib.loads((exp / "experiment.toml").read_text())
    assert doc["experiment"]["report-rounds"] == [1, 3, 12] and doc["experiment"]["report-note"] == 'stopped by a "deadline"'
    assert doc["runs"]["fast"]["method"] == "fedavg"
    done = tmp_path / "done"
    (done / "fedavg" / "seed0").mkdir(parents=True)
    (done / "fedavg" / "seed0" / "results.json").write_text(json.dumps(_run(0, [0.1] * 20)))
    (done / "experiment.toml").write_text('[experiment]\nname = "done"\n')
    assert mark_stopped(done) == [] and (done / "experiment.toml").read_text() == '[experiment]\nname = "done"\n'
    assert mark_stopped(exp, "another") == [1, 3, 12]  # an existing note is kept
    assert tomllib.loads((exp / "experiment.toml").read_text())["experiment"]["report-note"] == 'stopped by a "deadline"'


def test_check_line_says_per_commit_and_machine_what_the_re_run_check_found(tmp_path):
    exp = tmp_path / "exp"
    assert check_line(exp) == []                                                    # no check: nothing said
    (exp / "near-ties").mkdir(parents=True)
    here = {"commit": "8eead4b0aaaa", "code": "c1", "cpu_capability": "AVX512", "platform": "p"}
    runs = {"fedavg-e1": {"status": "accuracy identical", "checked_on": here,
                          "max_abs_difference_by_key": {"global_accuracy": 0.0, "global_loss": 1.6e-7}},
            "fedbc-e1": {"status": "accuracy identical", "checked_on": here,
                         "max_abs_difference_by_key": {"global_accuracy": 0.0, "global_loss": 5e-8}},
            "fedavg-e25": {"status": "identical", "checked_on": here},
            "fedbc-e50": {"status": "no reported run", "checked_on": here},
            # an entry of an older file: the file's stack is where it ran
            "scaffold-e10": {"status": "differs", "max_abs_difference": 0.02}}
    old = {"git": {"commit": "00ca0d7baeff"}, "code": {"digest": "c0"}, "cpu_capability": "AVX2"}
    (exp / "near-ties" / "chosen_check.json").write_text(json.dumps({"seed": 0, "stack": old, "runs": runs}))
    line = check_line(exp)[0]
    assert "(`results/exp/near-ties/chosen_check.json`, seed 0," in line
    assert ("at commit 8eead4b0aa (code c1, AVX512 CPU kernels), 3 chosen run(s) re-run: 1 identical, 2 accuracy "
            "identical (every accuracy of every round equal, the losses within 1.6e-07)") in line
    assert "at commit 00ca0d7bae (code c0, AVX2 CPU kernels), 1 chosen run(s) re-run: 1 differ (scaffold-e10)" in line
    assert "fedbc-e50" not in line
    # a check on another machine (--check-file): a line of its own, with how far the accuracies moved
    other = {"fedavg": {"status": "differs", "checked_on": here,
                        "max_abs_difference_by_key": {"global_accuracy": 0.024, "global_loss": 0.08}}}
    (exp / "near-ties" / "chosen_check.AVX512.json").write_text(json.dumps({"seed": 0, "runs": other}))
    first, _, second, _ = check_line(exp)
    assert "chosen_check.AVX512.json" in first and "chosen_check.json" in second   # sorted by file name
    assert "1 differ (fedavg; largest per-round accuracy difference 2.40 points)" in first
