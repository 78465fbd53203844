"""The local diagnoser: explanations and recovery hints for failed turns, from a llama.cpp-served model.

``Diagnoser.explain`` takes the step's failed turns and returns one ``Explanation`` per turn. It asks the model
only for failures it has not seen before (the content hash of ``FailedTurn.key``; earlier answers come from the
run's store), and it never lets the model stop the loop:

* each request has a timeout; a request that gets no answer leaves that turn with its rule label only;
* if the llama.cpp server dies, it is restarted once; if it dies again, the rest of the step is rule-only
  (the rule labels stand, nothing is lost) and the next step starts it again;
* every answer is validated (seal_lite/core/explainer.py); an invalid one is recorded as such and the rule
  label stands.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from seal_lite.core.explainer import (
    FailedTurn,
    InvalidDiagnosis,
    argument_values,
    build_messages,
    parse_diagnosis,
    schema_for,
)
from seal_lite.core.interface import render_tools
from seal_lite.core.labels import EXCLUDED_LABELS, SUCCESS_LABELS
from seal_lite.core.recipe import DiagnoserConfig
from seal_lite.core.types import EpisodeDiagnosis, Explanation, StepReport, TurnRecord
from seal_lite.engines.serving import BackendError, InProcessModel, LocalServer, ServerModel
from seal_lite.envs.task import Task

log = logging.getLogger("seal_lite.diagnoser")


class Diagnoser:
    def __init__(self, config: DiagnoserConfig, model_path: str, lookup=lambda key: None):
        """``model_path``: the GGUF (unused with mode ``url``); ``lookup(key)``: a stored Explanation row or None."""
        self.config, self.model_path, self.lookup = config, model_path, lookup
        self.model_id = config.url if config.mode == "url" else Path(model_path).name
        self.server: LocalServer | None = None
        self.backend = None

    def start(self) -> Diagnoser:
        mode = self.config.mode
        if mode == "in_process":
            self.backend = InProcessModel(self.model_path, self.config.n_ctx, self.config.n_threads)
        elif mode == "server":
            self.server = LocalServer(self.model_path, self.config.n_ctx, self.config.n_threads).start()
            self.backend = ServerModel(self.server.url)
        elif mode == "url":
            self.backend = ServerModel(self.config.url)
        return self

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
        if self.server is not None:
            self.server.stop()
        self.backend = self.server = None

    def __enter__(self) -> Diagnoser:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def explain(self, turns: list[FailedTurn]) -> tuple[list[Explanation | None], StepReport]:
        """One Explanation (or None: not diagnosed) per failed turn, and what it took."""
        report = StepReport(turns=len(turns))
        started = time.monotonic()
        answers: dict[str, Explanation | None] = {}
        restarts_left, gave_up = 1, False
        keys = [turn.key(self.model_id) for turn in turns]
        for key, turn in zip(keys, turns):
            if key in answers:
                continue
            report.unique += 1
            stored = self.lookup(key)
            if stored is not None:
                answers[key] = Explanation(**stored)
                report.cached += 1
                continue
            if gave_up or report.asked >= self.config.max_per_step:
                answers[key] = None
                report.skipped += 1
                continue
            answer = self._ask(key, turn, report)
            if answer.status == "failed" and self.server is not None and not self.server.alive():
                if restarts_left:  # the server died: restart it once in this step, then ask again
                    restarts_left -= 1
                    log.warning("diagnoser: the llama.cpp server died (%s); restarting it once", answer.error)
                    if self._restart(report):
                        answer = self._ask(key, turn, report)
                if answer.status == "failed":
                    gave_up = True
                    log.warning("diagnoser: the llama.cpp server is gone again; rule labels only for the rest of "
                                "this step")
            if answer.status == "failed":  # not stored: a later step may get an answer
                answers[key] = None
                continue
            answers[key] = answer
            report.new.append(answer)
        report.seconds = time.monotonic() - started
        return [answers[key] for key in keys], report

    def _ask(self, key: str, turn: FailedTurn, report: StepReport) -> Explanation:
        report.asked += 1
        started = time.monotonic()
        try:
            text = self.backend.complete(build_messages(turn), schema_for(turn), self.config.max_tokens,
                                         self.config.timeout_s)
        except BackendError as error:
            report.failed += 1
            return Explanation(key, self.model_id, "failed", error=str(error)[:300],
                               seconds=time.monotonic() - started)
        seconds = time.monotonic() - started
        try:
            diagnosis = parse_diagnosis(text, turn)
        except InvalidDiagnosis as error:
            report.invalid += 1
            return Explanation(key, self.model_id, "invalid", error=f"{error}"[:300], seconds=seconds)
        report.redactions += diagnosis.redactions
        return Explanation(key, self.model_id, "ok", diagnosis.label, diagnosis.cause, diagnosis.culprit_call_index,
                           diagnosis.explanation, diagnosis.recovery_hint, diagnosis.redactions, seconds)

    def _restart(self, report: StepReport) -> bool:
        report.restarts += 1
        self.server.stop()
        try:
            self.server.start()
        except BackendError as error:
            log.warning("diagnoser: restart failed: %s", error)
            return False
        self.backend = ServerModel(self.server.url)
        return True


def failed_turns(task: Task, records: list[TurnRecord], diagnosis: EpisodeDiagnosis) -> dict[int, FailedTurn]:
    """The turns of one episode worth explaining (failure labels that weight advantages), by turn index."""
    hidden = argument_values([call for turn in task.ground_truth for call in turn])
    seen: list[str] = []  # what the agent has seen up to and including each turn
    cases = {}
    for index, turn in enumerate(diagnosis.turns):
        record = records[index] if index < len(records) else TurnRecord(task.user_message(index))
        visible = task.visible_functions(index)
        seen += [render_tools(visible, "signatures"), record.user_text]
        seen += [f"{o.shown} {o.result}" for o in record.outcomes]
        if turn.label in SUCCESS_LABELS or turn.label in EXCLUDED_LABELS:
            continue
        evidence = turn.evidence
        called = {o.call.name for o in record.outcomes if o.call}
        cases[index] = FailedTurn(
            # every visible tool by name, and the signatures of those the model called: a third of the tokens
            tools="\n".join([f"Available: {', '.join(doc['name'] for doc in visible)}",
                              render_tools([doc for doc in visible if doc["name"] in called], "signatures")]).strip(),
            user_text=record.user_text,
            calls=tuple((o.shown, o.status, o.result[:300]) for o in record.outcomes),
            rule_label=turn.label,
            rule_cause=turn.cause,
            evidence=tuple(evidence.differences) + tuple(
                f"{name}: {value}" for name, value in (("ground truth error", evidence.gt_error),
                                                       ("checker error", evidence.checker_error)) if value
            ),
            seen_text="\n".join(seen),
            hidden_values=hidden,
        )
    return cases
