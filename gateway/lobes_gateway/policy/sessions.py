"""Conversations a pool serves, and what binding one more of them to a replica costs the rest.

Placing each turn where it finishes first is selfish: on the acceptance run's Spark and Thor
pair, once a session's history is cached on the fast Spark, its next turn on the slow Thor would
prefill that history there and decode 4.4x slower, so every turn stays on the Spark, whose queue
then makes every session wait (agent sessions with ~2,000-token tool outputs, one session's
worth of turns on the Thor where four or five sessions placed whole there cut the time to first
token about 2x). A session is a closed loop: it comes back a tool call after each answer, to the
replica that holds its history. So a turn is priced with the wait its session adds, over its
next round, to the sessions bound to the replica it goes to.

What is learned, with no round trip and no session id: a conversation is a chain of prompts,
each beginning with the one before (its last full block is a block of the next); from that,
the time between an answer and the next turn (the session's think time), the share of turns
that are continued, and the sessions bound to each replica (a first turn counts as one as
often as first turns are continued). A replica is modelled as a closed
loop of its bound sessions (exact mean value analysis: one queueing station, the engine's time
a turn holds it, and a delay, the think time and the part of a turn's decode that overlaps
the other slots'), and the cost of one more session there is how much it adds to the sum of
their response times over one round.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .estimate import Estimate
from .prefix import BLOCK_CHARS, RequestShape

# Until a continuation has been seen, sessions are assumed to come back within this many
# seconds of an answer (an agent's tool call, a person reading).
DEFAULT_THINK_S = 30.0
# A conversation not continued within this many think times is taken to have ended.
EXPIRY_THINK_TIMES = 4.0
# A session whose next turn arrived waits for it to be placed, however long the pool's queue
# holds it (a 23k-token first turn waited 9 s at time-scale 10 while its think time was 0.2 s);
# it is dropped only when that turn is not placed within this many seconds (the default
# GATEWAY_UPSTREAM_TIMEOUT_S): its client gave up.
MAX_QUEUED_S = 600.0
# Rounds ahead a session's placement is priced over at most: a migration's prefill is paid
# once and its gain every round after, but loads further ahead than this are not foreseeable.
MAX_ROUNDS_AHEAD = 8.0
# Each outcome (continued or not) weighs this much less on the next: ~100 outcomes remembered.
OUTCOME_DECAY = 0.99
# Conversations remembered between turns at most (the oldest answered go first, as dropped):
# one-off prompts are remembered too until they expire, and must not grow without bound.
MAX_THINKING = 4096
# Sessions modelled per replica at most: bounded work per placement (the mean value analysis
# takes a step per session), and far more than the slots of any box.
MAX_MODELLED_SESSIONS = 256


@dataclass
class Conversation:
    """One chain of turns: the replica its latest turn went to, its turns, when it ended."""

    origin: str
    # Its latest prompt: the characters of its text, and a hash of the text past its last
    # full block, so that a later prompt is known to begin with all of it.
    chars: int
    tail: int
    turns: int = 1
    ended_at: float | None = None  # None while its latest turn runs
    returned_at: float | None = None  # its next turn arrived (it may wait for a slot)

    @property
    def established(self) -> bool:
        """Continued at least once: a session, not a one-off prompt."""
        return self.turns > 1


@dataclass(frozen=True)
class TurnCost:
    """What a session's turn costs a replica's engine, seconds: the time it holds the whole
    engine (its prefill, and its decode's share of the slots) and the rest of its decode,
    which runs beside the other slots'."""

    engine_s: float
    overlap_s: float


def response_s(turn: TurnCost, think_s: float, sessions: int) -> float:
    """Mean response time of a turn on a replica serving `sessions` closed-loop sessions
    (exact mean value analysis: queueing at the engine, the think time and overlap as delay)."""
    return _responses(turn, think_s, sessions)[-1]


def join_cost_s(turn: TurnCost, think_s: float, sessions: int) -> float:
    """Seconds one more session adds to the response times of a round of the replica's
    sessions, its own included."""
    responses = _responses(turn, think_s, sessions + 1)
    return (sessions + 1) * responses[-1] - sessions * responses[-2]


def _responses(turn: TurnCost, think_s: float, sessions: int) -> list[float]:
    """The mean response time with 0, 1, ... `sessions` sessions (0 for none), one pass."""
    responses = [0.0]
    queued = 0.0
    for count in range(1, min(sessions, MAX_MODELLED_SESSIONS) + 1):
        engine = turn.engine_s * (1 + queued)
        throughput = count / (engine + turn.overlap_s + think_s)
        queued = throughput * engine
        responses.append(engine + turn.overlap_s)
    return responses


class Conversations:
    """The live conversations of one pool, by the last full block of their latest prompt."""

    def __init__(self, smoothing: float) -> None:
        self._running: dict[int, Conversation] = {}
        self._thinking: OrderedDict[int, Conversation] = OrderedDict()  # oldest answer first
        self._bound: dict[str, int] = {}  # established conversations per replica
        # Conversations of one turn so far per replica (its turn running, or answered and not
        # expired): sessions in the making, as many of them as first turns go on.
        self._opened: dict[str, int] = {}
        # Seconds from an answer to its session's next turn, learned from continuations.
        self._think = Estimate(None, smoothing)
        # Answered turns that were continued and that were not, decayed (OUTCOME_DECAY).
        self._continued = 0.0
        self._dropped = 0.0
        # The same for first turns alone: how many conversations become sessions.
        self._first_continued = 0.0
        self._first_dropped = 0.0
        # continued()'s last answer, for the request whose blocks it found it for, while the
        # thinking conversations stay as they were (_changes counts their changes): a pooled
        # turn asks three times (arrival, pricing, placement), a long prompt's search costs
        # tens of microseconds each time.
        self._changes = 0
        self._last_asked: tuple[tuple[int, ...], int, tuple[int, Conversation] | None] | None = None

    def think_s(self) -> float:
        """The sessions' think time: learned, else DEFAULT_THINK_S."""
        learned = self._think.value
        return DEFAULT_THINK_S if learned is None else learned

    def remembered(self) -> int:
        """Conversations remembered between turns."""
        return len(self._thinking)

    def rounds_ahead(self) -> float:
        """The turns a session is expected to send after this one (a turn is continued with
        the share of answered turns that were, one more seen dropped as a prior), bounded by
        MAX_ROUNDS_AHEAD; 0 until one turn has been continued."""
        return min(MAX_ROUNDS_AHEAD, self._continued / (self._dropped + 1))

    def continued(self, request: RequestShape) -> tuple[int, Conversation] | None:
        """The conversation whose latest answered turn this request continues, if any: the
        request's chat begins with that turn's whole prompt and goes on past it."""
        if not self._thinking or not is_chat_turn(request):
            return None
        last = self._last_asked
        if last is not None and last[0] is request.blocks and last[1] == self._changes:
            return last[2]
        found = self._find_continued(request)
        self._last_asked = (request.blocks, self._changes, found)
        return found

    def _find_continued(self, request: RequestShape) -> tuple[int, Conversation] | None:
        # Set operations run in C: a Python loop over a 16k-token prompt's blocks cost 0.16 ms.
        held = self._thinking.keys() & request.blocks
        if not held:
            return None
        index = max(map(request.blocks.index, held))  # the latest turn the prompt holds
        conversation = self._thinking[request.blocks[index]]
        ends = (index + 1) * BLOCK_CHARS
        if (len(request.text) > conversation.chars
                and hash(request.text[ends:conversation.chars]) == conversation.tail):
            return request.blocks[index], conversation
        return None

    def returned(self, request: RequestShape, now: float) -> None:
        """A request arrived that may wait before it is placed: its session stopped
        thinking now (its wait for a slot is part of its turn, not of its think time)."""
        if (found := self.continued(request)) is not None and found[1].returned_at is None:
            found[1].returned_at = now
            self._thinking.move_to_end(found[0])  # remembered in the order last seen

    def bound(self, origin: str, excluding: Conversation | None = None) -> int:
        """Sessions bound to the replica, less `excluding` when it is one of them: the
        established ones and as many of its one-turn conversations as first turns go on (so a
        burst of first turns is counted where it went before its second turns come back)."""
        established = self._bound.get(origin, 0)
        opened = self._opened.get(origin, 0)
        if excluding is not None and excluding.origin == origin:
            if excluding.established:
                established -= 1
            else:
                opened -= 1
        if opened <= 0:
            return established
        share = self._first_continued / (self._first_continued + self._first_dropped or 1.0)
        return established + round(opened * share)

    def expire(self, now: float) -> None:
        """Forget conversations not continued within EXPIRY_THINK_TIMES think times, or
        whose arrived turn was not placed within MAX_QUEUED_S."""
        horizon = EXPIRY_THINK_TIMES * self.think_s()
        while self._thinking:
            block, conversation = next(iter(self._thinking.items()))
            if conversation.returned_at is not None:
                overdue = now - conversation.returned_at > MAX_QUEUED_S
            else:
                overdue = now - (conversation.ended_at or now) > horizon
            if len(self._thinking) <= MAX_THINKING and not overdue:
                return
            del self._thinking[block]
            self._changes += 1
            self._unbind(conversation)
            self._learn_outcome(conversation, continued=False)

    def placed(self, request: RequestShape, origin: str, now: float) -> int | None:
        """A request went to `origin`: it continues its conversation there or starts one. The
        key to end its turn with (ended), or None when it is not tracked (no chat, or the
        same prompt as one already live: a retry or a twin)."""
        if not is_chat_turn(request):
            return None
        key = request.blocks[-1]
        if key in self._running:
            return None
        found = self.continued(request)
        tail = hash(request.text[len(request.blocks) * BLOCK_CHARS:])
        if found is None:
            if key in self._thinking:
                return None
            conversation = Conversation(origin, len(request.text), tail)
            self._opened[origin] = self._opened.get(origin, 0) + 1
        else:
            block, conversation = found
            del self._thinking[block]
            self._changes += 1
            self._unbind(conversation)
            came_back = conversation.returned_at or now
            self._think.observe(came_back - (conversation.ended_at or came_back))
            self._learn_outcome(conversation, continued=True)
            conversation.origin, conversation.ended_at = origin, None
            conversation.returned_at = None
            conversation.chars, conversation.tail = len(request.text), tail
            conversation.turns += 1
        self._running[key] = conversation
        if conversation.established:
            self._bound[origin] = self._bound.get(origin, 0) + 1
        return key

    def ended(self, key: int | None, now: float) -> None:
        """The turn placed under `key` was answered: its session is thinking from now."""
        conversation = self._running.pop(key, None) if key is not None else None
        if conversation is not None:
            conversation.ended_at = now
            self._thinking[key] = conversation
            self._changes += 1

    def _unbind(self, conversation: Conversation) -> None:
        counts = self._bound if conversation.established else self._opened
        counts[conversation.origin] -= 1

    def _learn_outcome(self, conversation: Conversation, continued: bool) -> None:
        """An answered turn was continued, or its conversation ended (before the turn that
        continues it is counted)."""
        self._continued = self._continued * OUTCOME_DECAY + continued
        self._dropped = self._dropped * OUTCOME_DECAY + (not continued)
        if not conversation.established:
            self._first_continued = self._first_continued * OUTCOME_DECAY + continued
            self._first_dropped = self._first_dropped * OUTCOME_DECAY + (not continued)


def is_chat_turn(request: RequestShape) -> bool:
    """Whether a request can be a session's turn: a chat whose every full block is hashed
    (a prompt past MAX_PROMPT_BLOCKS is not followed)."""
    return bool(request.text) and len(request.blocks) == len(request.text) // BLOCK_CHARS > 0
