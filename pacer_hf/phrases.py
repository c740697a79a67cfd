"""`PhrasePool`: candidate continuations that let the draft confirm several tokens in one forward (phrase drafting,
as in Ouroboros, arXiv 2402.13720).

A phrase is only a guess: the draft model still chooses every token itself, and a phrase token counts only where it
equals that choice (see `PacerCandidateGenerator`). So whatever the pool holds, the output is unchanged; the pool
only decides how many draft tokens one draft forward can yield.

Two sources, looked up by the last 3, 2 or 1 tokens of the context (the longest key that matches wins):
- the live sequence (prompt + output of the current `generate()` call), indexed incrementally as tokens are
  accepted: a key maps to every position its n-gram ended at, and the phrase is read from the sequence after the
  occurrence whose preceding tokens match the context furthest back (the latest one among equals);
- stored phrases, bounded and evicted least recently used: the target's tokens on rejected branches, the rejected
  draft suffix, and (warm start) the sequences of earlier calls with the same pool.
"""

from collections import OrderedDict
from collections.abc import Sequence

KEY_LENGTHS = (3, 2, 1)
# How far back a live-sequence match is followed, and how many of a key's latest occurrences are compared: the
# occurrence whose context matches furthest back is the likeliest to continue as the text does now.
MAX_MATCH_LENGTH = 32
MAX_OCCURRENCES_COMPARED = 64


class PhrasePool:
    """Candidate phrases for phrase drafting, kept across `generate()` calls when the same pool is passed again.

    ```python
    pool = PhrasePool()
    for prompt in prompts:  # later calls start warm with what earlier ones produced
        target.generate(**prompt, assistant_model=draft, pacer_head=head, pacer_phrases=pool)
    ```

    A pool follows one `generate()` call at a time (it indexes that call's sequence): give concurrent calls a pool
    each.

    Args:
        max_phrases (`int`, defaults to 65536):
            Most stored phrases (keys); the least recently used ones are evicted. The live sequence of the current
            call is indexed on top of that and moved into the stored phrases when the next call starts.
        phrase_length (`int`, defaults to 8):
            Longest phrase a look-up returns and a stored phrase keeps.
    """

    def __init__(self, max_phrases: int = 65536, phrase_length: int = 8):
        if isinstance(max_phrases, bool) or not isinstance(max_phrases, int) or max_phrases < 1:
            raise ValueError(f"`max_phrases` must be a positive integer, got {max_phrases!r}.")
        if isinstance(phrase_length, bool) or not isinstance(phrase_length, int) or phrase_length < 1:
            raise ValueError(f"`phrase_length` must be a positive integer, got {phrase_length!r}.")
        self.max_phrases = max_phrases
        self.phrase_length = phrase_length
        self._stored: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self._sequence: list[int] = []  # the live sequence (prompt + accepted output)
        self._positions: dict[tuple[int, ...], list[int]] = {}  # n-gram -> starts of the tokens that followed it
        self._indexed = 1  # starts below this are indexed; a start needs one token before it and one at it

    def __len__(self) -> int:
        return len(self._stored)

    # ---- the live sequence ------------------------------------------------------------------------------------

    def start_sequence(self, prompt: Sequence[int]) -> None:
        """Begins a new `generate()` call: stores the previous call's sequence (warm start), then indexes `prompt`."""
        for key, starts in self._positions.items():
            self._store(key, self._sequence[starts[-1] : starts[-1] + self.phrase_length])
        self._sequence, self._positions, self._indexed = [], {}, 1
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

    def lookup(self, context: Sequence[int], max_length: int) -> tuple[list[int], int]:
        """The phrase that follows `context` (the whole sequence so far: prompt, output and this round's draft), at
        most `max_length` tokens, and the length of the match: how many of the context's last tokens equal those
        before the phrase (1 to `MAX_MATCH_LENGTH` for the live sequence, the key's length for a stored phrase; 0
        and an empty phrase when nothing matched). A subclass may propose phrases by another rule; any phrase keeps
        the output exact."""
        if max_length <= 0:
            return [], 0
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
                return self._sequence[start : start + max_length], matched
            phrase = self._stored.get(key)
            if phrase is not None:
                self._stored.move_to_end(key)
                return list(phrase[:max_length]), n
        return [], 0

    def _furthest_match(self, starts: list[int], context: Sequence[int], key_length: int) -> tuple[int, int]:
        """Of the latest occurrences of a key (`starts`, oldest first), the one whose preceding tokens match
        `context` furthest back, and how far (the latest one among equals)."""
        sequence, best, best_length = self._sequence, starts[-1], key_length
        for start in reversed(starts[-MAX_OCCURRENCES_COMPARED:]):
            length = key_length
            while (length < MAX_MATCH_LENGTH and length < start and length < len(context)
                   and sequence[start - length - 1] == context[-length - 1]):
                length += 1
            if length > best_length:
                best, best_length = start, length
        return best, best_length

    def clear(self) -> None:
        """Forgets every stored phrase and the live sequence."""
        self._stored.clear()
        self._sequence, self._positions, self._indexed = [], {}, 1
