"""docs/RESULTS.md's generated parts added by issues 30/31: the stack line of every table and the table of
ours beside a paper's values (experiments/report.py)."""

from experiments.report import paper_table, stacks_line
from flcore.stack import describe


def _doc(gfl, pfl, stack=None):
    return {"final": {"global_accuracy": gfl, "local_accuracy": pfl}, "stack": stack}


STACK = {"python": "3.11.7", "packages": {"torch": "2.14.1"}, "lock": {"matches": True, "digest": "d1"},
         "git": {"commit": "f" * 40, "dirty": False}}


def test_stacks_line_counts_runs_per_stack():
    runs = {"a": [_doc(0.5, 0.6, STACK), _doc(0.5, 0.6, STACK)], "b": [_doc(0.5, 0.6)]}
    line = stacks_line(runs)
    assert line == (f"Stack: {describe(STACK)} (2 runs); {describe(None)} (1 run).")


def test_paper_table_sets_ours_beside_the_papers_values():
    runs = {"fedavg": [_doc(0.70, None), _doc(0.80, None)], "fedrane": [_doc(0.9, 0.95)]}
    paper = {"source": "Table 1", "g-fl": {"fedavg": 0.7902, "fedrane": 0.8892}, "p-fl": {"fedrane": 0.9797}}
    lines = paper_table(runs, ["fedrane", "fedavg"], paper).splitlines()
    assert lines[0] == "Beside the paper (Table 1):"
    assert lines[4] == "| fedrane | 1 | 90.00 | 88.92 | 95.00 | 97.97 |"
    assert lines[5] == "| fedavg | 2 | 75.00 ± 7.07 | 79.02 | – | - |"
    assert paper_table(runs, [], {}) == ""
