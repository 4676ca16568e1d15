"""Best-of-N query rewriting with BEACON in LlamaIndex, fully offline.

``BeaconQueryTransform`` samples rewrites of a terse user query (``mode="rewrite"``), or
HyDE-style hypothetical answers (``mode="hyde"``), scores each by how well it retrieves -- the
cosine similarity of its best match in the index -- and keeps the one the scorer prefers, stopping
by the BEACON rule instead of always writing N rewrites. It plugs into ``TransformQueryEngine``.

The embedding is a deterministic bag-of-words model and the LLMs are scripted stand-ins.

Run:  python examples/llamaindex_query_transform.py
"""

from __future__ import annotations

import json

from _shared import BagOfWordsEmbedding, ScriptedLLM
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.query_engine import TransformQueryEngine

import beacon
from beacon_integrations.llama_index import BeaconQueryTransform

DOCS = [
    Document(text="To reset a forgotten router password, hold the reset button for ten seconds "
                  "and log in with the default admin password printed on the label.",
             doc_id="router-reset"),
    Document(text="Wi-Fi speed drops with distance and walls; move the router to a central spot.",
             doc_id="wifi-speed"),
    Document(text="Printer offline errors are usually fixed by restarting the print spooler.",
             doc_id="printer"),
]
REWRITES = [
    "router problem",
    "how to reset a forgotten router admin password",
    "internet not working",
    "reset router password default admin login",
    "router settings",
    "forgot wifi password",
]
HYDE_DOCS = [  # one per possible sample (horizon 8), so no hypothetical answer repeats
    "You may need to call your internet provider.",
    "Hold the reset button on the router for ten seconds, then log in with the default "
    "admin password printed on the label.",
    "Routers have lights that show their status.",
    "Try restarting the router and your computer.",
    "The admin password is printed on a label on the router.",
    "Check that the network cable is plugged in.",
    "A forgotten router password can be reset with the reset button.",
    "Update the router firmware from the manufacturer's website.",
]


def main() -> None:
    index = VectorStoreIndex.from_documents(DOCS, embed_model=BagOfWordsEmbedding())
    retriever = index.as_retriever(similarity_top_k=1)

    async def retrieval_quality(query: str, rewrite: str) -> float:
        """Cosine similarity of the rewrite's best match in the index (0 to 1)."""
        hits = await retriever.aretrieve(rewrite)
        return float(hits[0].score or 0.0) if hits else 0.0

    # c = 0.08 similarity points per LLM call.
    cfg = beacon.BeaconConfig(cost=0.08, horizon=8, family="normal")
    for mode, script in (("rewrite", REWRITES), ("hyde", HYDE_DOCS)):
        transform = BeaconQueryTransform(
            ScriptedLLM(script=script), retrieval_quality, cfg, mode=mode,  # type: ignore[arg-type]
            include_original=False,
        )
        answerer = ScriptedLLM(script=["Hold reset for 10 s, then use the label's password."])
        engine = TransformQueryEngine(
            index.as_query_engine(llm=answerer, similarity_top_k=1), transform
        )
        resp = engine.query("cant get into my router")
        res = transform.last_result
        assert res is not None and res.best is not None
        print(f"[{mode}] chose {res.best.text!r} (similarity {res.best.reward:.3f})")
        for c in res.candidates:
            print(f"  candidate {c.index}: {c.reward:.3f}  {c.text!r}")
        print(f"  used {res.n_samples}/{cfg.horizon} LLM calls; stop reason: {res.stop_reason}")
        last = res.trace[-1]
        if last.reason == "index":
            print(f"  stopped because h={last.h:.4f} <= c/sigma={last.threshold:.4f} at k={last.k}")
        print(f"  answer: {resp} (source: {[s.node.ref_doc_id for s in resp.source_nodes]})")
        print("SUMMARY " + json.dumps({
            "id": mode, "n_samples": res.n_samples, "stop_reason": res.stop_reason,
            "chosen_reward": res.best.reward,
            "max_used_reward": max(c.reward for c in res.scored if c.reward is not None),
            "horizon": cfg.horizon,
        }))


if __name__ == "__main__":
    main()
