"""A LangChain agent that calls BEACON as a tool, fully offline.

The tool (``BeaconRunnable.as_beacon_tool``) answers a Game-of-24 puzzle by sampling attempts
until one verifies. The verdicts are those of logged GPT-4 chain-of-thought attempts
(``examples/data/tot_game24_gpt4.jsonl``, MIT; the log keeps the checks, not the attempts' texts):
a fake chat model answers with a placeholder per logged attempt (``attempt 2 at '4 5 7 9'``), in
logged order, and the 0/1 verifier returns that attempt's logged check, so the ``bernoulli``
family applies (Beta(1, 1) prior, paper appendix "Binary-Reward Variant"): one success is the
maximum possible reward, so sampling stops ("absorbed") at the first verified attempt, or gives up
without one (stop reason "index") once the reservation cost h^B_{n,k}(a, b) is at most c.

The agent itself is ``langchain.agents.create_agent`` driven by a fake tool-calling chat model
that calls the tool once and then answers with a fixed line pointing at the tool's result (it is
scripted before the tool runs, so it cannot say whether the attempt verified; the script prints
that).

Run:  python examples/langchain_agent.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

import beacon
from beacon_integrations.langchain import BeaconRunnable

DATA = Path(__file__).parent / "data" / "tot_game24_gpt4.jsonl"
PUZZLE_IDS = ("910", "900", "901")


class LoggedAttempts(BaseChatModel):
    """Replays the logged attempts for the puzzle named in the question, in logged order."""

    attempts: dict[str, list[str]]
    _next: dict[str, int] = PrivateAttr(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "logged-attempts"

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        question = messages[-1].text
        key = next(k for k in self.attempts if k in question)
        i = self._next.get(key, 0)
        self._next[key] = i + 1
        return ChatResult(generations=[ChatGeneration(
            message=AIMessage(content=self.attempts[key][i])
        )])

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._generate(messages)


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel replaying scripted tool calls; binding tools is a no-op."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def main() -> None:
    rows = {}
    with DATA.open() as f:
        for line in f:
            row = json.loads(line)
            if row["id"] in PUZZLE_IDS:
                rows[row["id"]] = row
    attempts: dict[str, list[str]] = {}
    verdict: dict[str, bool] = {}
    for row in rows.values():
        texts = [f"attempt {i} at '{row['prompt']}'" for i in range(len(row["correct"]))]
        attempts[row["prompt"]] = texts
        verdict.update(zip(texts, row["correct"], strict=True))

    def verifier(question: str, answer: str) -> float:
        """1.0 if the logged programmatic check accepted this attempt."""
        return 1.0 if verdict[answer] else 0.0

    cfg = beacon.BeaconConfig(cost=0.02, horizon=64, family="bernoulli")
    solver = BeaconRunnable(model=LoggedAttempts(attempts=attempts), scorer=verifier, config=cfg)
    tool = solver.as_beacon_tool(
        "solve_24", "Solve a Game-of-24 puzzle: use the four numbers once each to make 24."
    )

    for pid in PUZZLE_IDS:
        puzzle = rows[pid]["prompt"]
        agent_model = ToolCallingFake(messages=iter([
            AIMessage(content="", tool_calls=[{
                "name": "solve_24", "args": {"question": f"Make 24 from {puzzle}"},
                "id": f"call-{pid}",
            }]),
            AIMessage(content="I used the BEACON solver; its answer is the tool result above."),
        ]))
        agent = create_agent(agent_model, [tool])
        out = agent.invoke({"messages": [HumanMessage(content=f"Please solve {puzzle}")]})
        tool_msg = next(m for m in out["messages"] if m.type == "tool")
        res = tool_msg.artifact
        verified = [c["reward"] for c in res["candidates"]]
        logged = rows[pid]["correct"]
        first_success = f"#{logged.index(True)}" if any(logged) else "none in 64"
        print(f"puzzle {puzzle}: tool answered {tool_msg.content!r} "
              f"({'verified' if res['best_reward'] == 1.0 else 'NOT verified'})")
        print(f"  samples used: {res['n_samples']} of {cfg.horizon}; stop reason: "
              f"{res['stop_reason']}; verified attempts seen: {int(sum(verified))}")
        print(f"  first verified attempt in the log: {first_success}")
        last = res["trace"][-1]
        rel = "<=" if last["decision"] == "stop" else ">"
        # 4 significant digits: h^B is computed in floats (0.019999999999999997 is 0.02)
        print(f"  last decision: k={last['k']} h^B={last['h']:.4g} {rel} c={cfg.cost} -> "
              f"{last['decision']} ({last['reason']})")
        print(f"  agent: {out['messages'][-1].content}")
        summary = {"id": pid, "n_samples": res["n_samples"], "stop_reason": res["stop_reason"],
                   "chosen_reward": res["best_reward"], "max_used_reward": max(verified),
                   "horizon": cfg.horizon, "data": DATA.name, "config": cfg.to_dict()}
        print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    main()
