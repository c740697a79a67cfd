"""`PhrasePool`: candidate continuations that let the draft confirm several tokens in one forward (phrase drafting,
as in Ouroboros, arXiv 2402.13720).

A phrase is only a guess: the draft model still chooses every token itself, and a phrase token counts only where it
equals that choice (see `PacerCandidateGenerator`). So whatever the pool holds, the output is unchanged; the pool
only decides how many draft tokens one draft forward can yield.

Two sources, looked up by the last 3, 2 or 1 tokens of the context (the longest key that matches wins):
- the live sequence (prompt + output of the current `generate()` call), indexed incrementally as tokens are
  accepted: a key maps to every position its n-gram ended at. [`lookup`] reads the phrase after the occurrence whose
  preceding tokens match the context furthest back (the latest one among equals); [`lookup_earliest`] after the
  earliest occurrence of the last 2 tokens, else of the last one: transformers' prompt-lookup rule exactly, which
  often finds the source passage a summary or an extraction copies from;
- stored phrases, bounded and evicted least recently used: the target's tokens on rejected branches, the rejected
  draft suffix, and (warm start) the sequences of earlier calls with the same pool.

The round planner ([`RoundPlanner`]) also sends phrases to the target without the draft (copies); what it learns of
each source's acceptance picks between them.
"""

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

KEY_LENGTHS = (3, 2, 1)
# How far back a live-sequence match is followed, and how many of a key's latest occurrences are compared: the
# occurrence whose context matches furthest back is the likeliest to continue as the text does now.
MAX_MATCH_LENGTH = 32
MAX_OCCURRENCES_COMPARED = 64


@dataclass
class Phrase:
    """A looked-up continuation: `tokens`, its `source` (`"sequence"`: the live sequence by the furthest match,
    `"earliest"`: its earliest occurrence, `"stored"`: a stored phrase) and `match_length`, how many of the context's
    last tokens equal those before it (1 to `MAX_MATCH_LENGTH`; a stored phrase's key length)."""

    tokens: list[int]
    source: str
    match_length: int


NO_PHRASE = Phrase([], "none", 0)


class PhrasePool:
    """Candidate phrases for phrase drafting, kept across `generate()` calls when the same pool is passed again.

    ```python
    pool = PhrasePool()
    for prompt in prompts:  # later calls start warm with what earlier ones produced
        target.generate(**prompt, assistant_model=draft, pacer_head=head, pacer_phrases=pool)
    ```

    A pool follows one `generate()` call at a time (it indexes that call's sequence): a call that passes a pool in
    use by another unfinished call is refused; give concurrent calls a pool each.

    Args:
        max_phrases (`int`, defaults to 65536):
            Most stored phrases (keys); the least recently used ones are evicted. The live sequence of the current
            call is indexed on top of that and moved into the stored phrases when the next call starts.
        phrase_length (`int`, defaults to 8):
            Most phrase tokens fed to the draft beside its own input in one forward, for it to confirm, and kept per
            stored phrase. (Copies sent without the draft read the live sequence as far as the planner finds worth.)
    """

    # The keys [`lookup_earliest`] tries, longest first (a subset of `KEY_LENGTHS`, the lengths indexed):
    # transformers' prompt lookup matches the last 2 tokens, else the last 1 (`max_matching_ngram_size`'s default);
    # eval.research.lookup_ab runs others.
    prompt_lookup_keys: tuple[int, ...] = (2, 1)

    def __init__(self, max_phrases: int = 65536, phrase_length: int = 8):
        for name, value in (("max_phrases", max_phrases), ("phrase_length", phrase_length)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}).")
            if value < 1:
                raise ValueError(f"`{name}` must be >= 1, got {value}.")
        self.max_phrases = max_phrases
        self.phrase_length = phrase_length
        self._stored: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self._sequence: list[int] = []  # the live sequence (prompt + accepted output)
        self._positions: dict[tuple[int, ...], list[int]] = {}  # n-gram -> starts of the tokens that followed it
        self._indexed = 1  # starts below this are indexed; a start needs one token before it and one at it
        self._prompt_length = 0  # of the current call's sequence
        self._user: object | None = None  # the generate() call whose sequence the pool follows
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._stored)

    def acquire(self, user: object) -> None:
        """Marks the pool as following `user`'s call (pacer-hf's route does this). Raises `ValueError` while another
        call holds it: two calls' sequences would mix."""
        with self._lock:
            if self._user is not None and self._user is not user:
                raise ValueError(
                    "This `PhrasePool` is in use by another `generate()` call that has not finished: a pool follows "
                    "one call's sequence at a time. Give each concurrent call its own pool (by default, or with "
                    "`pacer_phrases=True`, each call makes a fresh one)."
                )
            self._user = user

    def release(self, user: object) -> None:
        """Ends `user`'s hold on the pool (a no-op for another user)."""
        with self._lock:
            if self._user is user:
                self._user = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock")
        state["_user"] = None  # a copy follows no call
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ---- the live sequence ------------------------------------------------------------------------------------

    def start_sequence(self, prompt: Sequence[int]) -> None:
        """Begins a new `generate()` call: stores the previous call's sequence (warm start), then indexes `prompt`."""
        for key, starts in self._positions.items():
            self._store(key, self._sequence[starts[-1] : starts[-1] + self.phrase_length])
        self._sequence, self._positions, self._indexed = [], {}, 1
        self._prompt_length = len(prompt)
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        """Appends accepted tokens to the live sequence and indexes every n-gram that now has a token after it.
        Each position is indexed once over the call (O(new tokens))."""
        sequence = self._sequence
        sequence.extend(tokens)
        for start in range(self._indexed, len(sequence)):
            for n in KEY_LENGTHS:
                if start >= n:
                    self._positions.setdefault(tuple(sequence[start - n : start]), []).append(start)
        self._indexed = max(self._indexed, len(sequence))

    @property
    def sequence_length(self) -> int:
        return len(self._sequence)

    # ---- stored phrases ---------------------------------------------------------------------------------------

    def add(self, context: Sequence[int], phrase: Sequence[int]) -> None:
        """Stores `phrase` as the continuation of the last 1-3 tokens of `context`."""
        for n in KEY_LENGTHS:
            if len(context) >= n:
                self._store(tuple(context[len(context) - n :]), phrase)

    def _store(self, key: tuple[int, ...], phrase: Sequence[int]) -> None:
        phrase = tuple(phrase[: self.phrase_length])
        if not phrase:
            return
        self._stored[key] = phrase
        self._stored.move_to_end(key)
        if len(self._stored) > self.max_phrases:
            self._stored.popitem(last=False)

    # ---- look-up ----------------------------------------------------------------------------------------------

    def lookup(self, context: Sequence[int], max_length: int) -> Phrase:
        """The phrase that follows `context` (the whole sequence so far: prompt, output and this round's draft), at
        most `max_length` tokens: from the live sequence after the occurrence that matches the context furthest back,
        else a stored phrase ([`NO_PHRASE`] when nothing matched). A subclass may propose phrases by another rule; any
        phrase keeps the output exact."""
        if max_length <= 0:
            return NO_PHRASE
        for n in KEY_LENGTHS:
            if len(context) < n:
                continue
            key = tuple(context[len(context) - n :])
            starts = self._positions.get(key)
            if starts is not None:
                # A shorter key's occurrences cannot match further back than the key: that would be a longer key
                # of the live sequence, which did not match. Only the longest key's occurrences are compared.
                start, matched = (self._furthest_match(starts, context, n) if n == KEY_LENGTHS[0]
                                  else (starts[-1], n))
                return Phrase(self._sequence[start : start + max_length], "sequence", matched)
            phrase = self._stored.get(key)
            if phrase is not None:
                self._stored.move_to_end(key)
                return Phrase(list(phrase[:max_length]), "stored", n)
        return NO_PHRASE

    def lookup_earliest(self, context: Sequence[int], max_length: int) -> Phrase:
        """What transformers' prompt lookup would send after `context`: the live sequence after the earliest
        occurrence of its last 2 tokens, else of its last token (its match counted like [`lookup`]'s);
        [`NO_PHRASE`] if none."""
        if max_length <= 0:
            return NO_PHRASE
        for n in self.prompt_lookup_keys:
            starts = self._positions.get(tuple(context[len(context) - n :])) if len(context) >= n else None
            if starts is not None:
                start = starts[0]
                return Phrase(self._sequence[start : start + max_length], "earliest",
                              self._match_length(start, context, n))
        return NO_PHRASE

    def copy_options(self, context: Sequence[int], max_length: int) -> list[Phrase]:
        """The continuations worth copying after `context`, once each: [`lookup`]'s (the furthest-matching occurrence,
        or a stored phrase) and [`lookup_earliest`]'s (prompt lookup's rule).

        Right after the prompt only stored phrases: there the context ends with the prompt's last tokens, in a chat
        model the template's header of the answer, whose earlier occurrences go on with the template (another turn,
        the system prompt), never with the answer (20 of 20 such copies wrong at their first token on the tuning
        prompts). Copies from the sequence start with the answer; a phrase stored by an earlier call may still
        begin it."""
        options: list[Phrase] = []
        for phrase in (self.lookup(context, max_length), self.lookup_earliest(context, max_length)):
            if phrase.tokens and all(phrase.tokens != other.tokens for other in options):
                options.append(phrase)
        if len(context) == self._prompt_length:
            options = [option for option in options if option.source == "stored"]
        return options

    def _furthest_match(self, starts: list[int], context: Sequence[int], key_length: int) -> tuple[int, int]:
        """Of the latest occurrences of a key (`starts`, oldest first), the one whose preceding tokens match
        `context` furthest back, and how far (the latest one among equals)."""
        best, best_length = starts[-1], key_length
        for start in reversed(starts[-MAX_OCCURRENCES_COMPARED:]):
            length = self._match_length(start, context, key_length)
            if length > best_length:
                best, best_length = start, length
        return best, best_length

    def _match_length(self, start: int, context: Sequence[int], key_length: int) -> int:
        """How many of the context's last tokens equal those before `start` in the sequence (at least the key's
        length, at most `MAX_MATCH_LENGTH`)."""
        sequence, length = self._sequence, key_length
        while (length < MAX_MATCH_LENGTH and length < start and length < len(context)
               and sequence[start - length - 1] == context[-length - 1]):
            length += 1
        return length

    def clear(self) -> None:
        """Forgets every stored phrase and the live sequence."""
        self._stored.clear()
        self._sequence, self._positions, self._indexed, self._prompt_length = [], {}, 1, 0
