"""BEACON as a LlamaIndex query engine, fully offline.

Part 1 -- RAG: ``BeaconQueryEngine(query_engine=...)`` wraps a regular query engine over a small
in-memory ``VectorStoreIndex`` and samples whole RAG responses (retrieval + synthesis) until the
BEACON rule stops; the chosen ``Response`` keeps its own source nodes. The embedding is a tiny
deterministic bag-of-words model and the LLM a scripted stand-in, so nothing leaves the machine.
The scorer is a rubric judge: the share of the reference facts an answer states.

Part 2 -- LLM mode with logged rewards, a reward transform and a fitted-style prior: the model
replays Tulu-2 samples for AlpacaEval instructions (the log keeps their judge scores, not their
texts, so each sample is a placeholder such as ``[instruction 0 / sample 5]``) and the scorer
returns the logged GPT-4-turbo judge probability (``examples/data/alpacaeval_tulu2_bon11.jsonl``;
research use only, see ``examples/data/LICENSE-alpacaeval.md``). Those rewards are probabilities
piled up near 0 and 1, far from normal, so the config decides on logit(r) (``transform="logit"``)
with an informative NIG prior (paper appendix "Priors and Minimal Sample Size").

Run:  python examples/llamaindex_query_engine.py
"""

from __future__ import annotations

import json
from pathlib import Path

from _shared import BagOfWordsEmbedding, ScriptedLLM
from llama_index.core import Document, VectorStoreIndex

import beacon
from beacon_integrations.llama_index import BeaconQueryEngine

ALPACA = Path(__file__).parent / "data" / "alpacaeval_tulu2_bon11.jsonl"


DOCS = [
    Document(text="Sunlight travels about 150 million kilometres to Earth at the speed of light, "
                  "which takes about 8 minutes and 20 seconds.", doc_id="sunlight"),
    Document(text="The Moon is about 384,000 kilometres from Earth; its light takes about "
                  "1.3 seconds to arrive.", doc_id="moon"),
    Document(text="Mars is on average 225 million kilometres from Earth.", doc_id="mars"),
]
ANSWERS = [
    "The Sun is very far away.",
    "Sunlight reaches Earth in about 8 minutes.",
    "Roughly a second, like moonlight.",
    "About 8 minutes and 20 seconds, crossing 150 million kilometres at the speed of light.",
    "It depends on the season.",
    "About 8 minutes 20 seconds.",
]
FACTS = ("8 minutes", "20 seconds", "150 million", "speed of light")


def rubric(question: str, answer: str) -> float:
    """Share of the reference facts the answer states (0 to 1)."""
    return sum(f in answer for f in FACTS) / len(FACTS)


def part1_rag() -> None:
    index = VectorStoreIndex.from_documents(DOCS, embed_model=BagOfWordsEmbedding())
    inner = index.as_query_engine(llm=ScriptedLLM(script=ANSWERS), similarity_top_k=1)
    cfg = beacon.BeaconConfig(cost=0.05, horizon=8, family="normal")
    engine = BeaconQueryEngine(rubric, cfg, query_engine=inner)
    resp = engine.query("How long does sunlight take to reach Earth?")
    md = resp.metadata or {}
    print(f"RAG answer: {resp.response!r}")
    print(f"  sources: {[s.node.ref_doc_id for s in resp.source_nodes]}")
    print(f"  candidates (reward): {list(zip(md['candidates'], md['rewards'], strict=True))}")
    print(f"  used {md['n_samples']}/{cfg.horizon} samples; stop reason: {md['stop_reason']}")
    for t in md["trace"]:
        if t["zhat"] is not None:
            print(f"  k={t['k']}: zhat={t['zhat']:.3f} h={t['h']:.4f} vs c/sigma="
                  f"{t['threshold']:.4f} -> {t['decision']}")
    print("SUMMARY " + json.dumps({
        "id": "rag", "n_samples": md["n_samples"], "stop_reason": md["stop_reason"],
        "chosen_reward": md["best_reward"],
        "max_used_reward": max(r for r in md["rewards"] if r is not None),
        "horizon": cfg.horizon,
    }))


def part2_logged_llm() -> None:
    with ALPACA.open() as f:
        rows = [json.loads(line) for line in f][:5]
    judge: dict[str, float] = {}
    for row in rows:
        for i, r in enumerate(row["rewards"]):
            judge[f"[instruction {row['id']} / sample {i}]"] = r

    def logged_judge(question: str, answer: str) -> float:
        return judge[answer]

    # Decide on logit(r) (units: log-odds); the prior says a query's logits spread by about 3.
    prior = beacon.NIGPrior(mu0=-5.0, nu0=1.0, alpha0=2.0, beta0=18.0)
    cfg = beacon.BeaconConfig(cost=0.3, horizon=11, family="normal", prior=prior,
                              transform="logit")
    total = 0
    for row in rows:
        llm = ScriptedLLM(script=[
            f"[instruction {row['id']} / sample {i}]" for i in range(len(row["rewards"]))
        ])
        engine = BeaconQueryEngine(logged_judge, cfg, llm=llm)
        resp = engine.query(row["prompt"])
        md = resp.metadata or {}
        total += md["n_samples"]
        print(f"instruction {row['id']}: chose {resp.response} with judge p={md['best_reward']:.3f}"
              f" (best of 11 = {max(row['rewards']):.3f}); used {md['n_samples']}/11;"
              f" stop: {md['stop_reason']}")
        print("SUMMARY " + json.dumps({
            "id": row["id"], "n_samples": md["n_samples"], "stop_reason": md["stop_reason"],
            "chosen_reward": md["best_reward"],
            "max_used_reward": max(r for r in md["rewards"] if r is not None),
            "horizon": cfg.horizon, "data": ALPACA.name, "config": cfg.to_dict(),
        }))
    print(f"LLM mode: {total} samples for {len(rows)} instructions (best-of-11: {11 * len(rows)})")


if __name__ == "__main__":
    part1_rag()
    part2_logged_llm()
