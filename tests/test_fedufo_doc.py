"""docs/FEDUFO.md's measured tables are the ones benchmarks/bench_fedufo.py generates from its result file."""

from benchmarks import bench_fedufo
from benchmarks.harness import load_result


def test_fedufo_doc_tables_are_generated_from_the_result_file():
    data = load_result(bench_fedufo.NAME)
    assert data is not None, "benchmarks/results/fedufo.json is missing: run python -m benchmarks.bench_fedufo"
    assert set(data["variants"]) == set(bench_fedufo.VARIANTS)
    doc = bench_fedufo.DOC.read_text()
    block = doc[doc.index(bench_fedufo.BEGIN) + len(bench_fedufo.BEGIN):doc.index(bench_fedufo.END)]
    assert block.strip() == bench_fedufo.report(data).strip(), "regenerate: python -m benchmarks.bench_fedufo --write-doc"
    # the claim the doc makes in section 1: the paper's order learns where the alternation does not
    v = data["variants"]
    assert v["fedufo"]["final_accuracy"] > 0.5 > v["fedufo-alternating"]["best_accuracy"]
