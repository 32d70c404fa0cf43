"""The paged KV pool: fixed-size blocks, reference counts and prefix caching.

Prefix caching keys each FULL block by a chained hash, `hash((parent_hash, block_tokens))`, so equal
hashes mean equal whole prefixes. A block whose last reference goes away stays in the hash table
(and keeps its contents) until it is handed out again; the free list is LRU, so the blocks reused
first are the uncached ones, then the cached ones freed longest ago. Freeing walks a block table
backwards, so a prefix's tail is evicted before its head.

In-flight blocks: when a sequence is admitted, the hashes of the full blocks it is about to compute
are *promised* (counted in a table of pending hashes) until it caches them or lets go of them
(finished, preempted, aborted). `pending_blocks` tells the scheduler how many of a waiting prompt's
next blocks some running sequence is computing right now, so that prompt can wait for the cache hit
instead of computing the same prefix a second time in the same batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field

from mcpmux.inference.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set only while this block is the one the hash table points at
    token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class PrefixMatch:
    """Cached blocks that hold a sequence's leading full blocks, in order."""

    block_ids: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


def chain_hash(parent: int | None, tokens: Tokens[int]) -> int:
    """Hash of a full block given its parent's hash: equal results mean equal prefixes."""
    return hash((parent, tuple(tokens)))


class BlockManager:
    """Hands out KV blocks to sequences and shares cached prefixes between them."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Unreferenced blocks, least recently freed first: the next one handed out is the front.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # chained hash -> block id
        self._pending: dict[int, int] = {}  # chained hash -> running sequences that will compute it
        self._promised: dict[str, list[int]] = {}  # request id -> its uncached full-block hashes, in order

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by live sequences (cached-but-free blocks count as free)."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids: Tokens[int]) -> PrefixMatch:
        """Longest run of cached full blocks at the start of `token_ids`, leaving at least one token
        to compute (the step that computes it produces the next token's logits)."""
        match = PrefixMatch()
        if not self.enable_prefix_caching:
            return match
        parent: int | None = None
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, chunk)
            block_id = self._cached.get(h)
            # The token check guards against a hash collision serving another prompt's K/V.
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            match.block_ids.append(block_id)
            match.hashes.append(h)
            parent = h
        return match

    def pending_blocks(self, token_ids: Tokens[int], match: PrefixMatch) -> int:
        """How many of the full blocks right after `match` (within the range `match_prefix` may ever
        hit) a running sequence is computing now: blocks that will be cached without computing them here."""
        if not self._pending:
            return 0
        parent = match.hashes[-1] if match.hashes else None
        bs = self.block_size
        count = 0
        for i in range(match.num_blocks, (len(token_ids) - 1) // bs):
            parent = chain_hash(parent, token_ids[i * bs : (i + 1) * bs])
            if parent not in self._pending:
                break
            count += 1
        return count

    def can_allocate(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Whether `seq` can get blocks for `num_new_tokens` more tokens (after taking `match`)."""
        reused = match.block_ids if match else []
        held = len(seq.block_table) + len(reused)
        cached_tokens = len(reused) * self.block_size
        needed = self.blocks_for(seq.num_computed_tokens + cached_tokens + num_new_tokens) - held
        # Matched blocks sitting in the free list stop being free once taken.
        available = len(self._free) - sum(1 for b in reused if b in self._free)
        return needed <= available

    def allocate(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> None:
        """Give `seq` the matched prefix blocks (advancing its progress past them), then fresh blocks
        until its table covers `num_new_tokens` more tokens. Call `can_allocate` first."""
        if match is not None and match.num_blocks:
            for block_id in match.block_ids:
                block = self.blocks[block_id]
                if block.ref_count == 0:
                    del self._free[block_id]
                block.ref_count += 1
            seq.block_table.extend(match.block_ids)
            seq.block_hashes.extend(match.hashes)
            seq.num_computed_tokens += match.num_blocks * self.block_size
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())
        if self.enable_prefix_caching and seq.request_id not in self._promised:
            self._promise(seq)

    def _promise(self, seq: Sequence) -> None:
        """Count the hashes of the full blocks `seq` holds tokens for but has not computed yet."""
        bs = self.block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        hashes = []
        for i in range(len(seq.block_hashes), seq.num_tokens // bs):
            parent = chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)
            self._pending[parent] = self._pending.get(parent, 0) + 1
        self._promised[seq.request_id] = hashes

    def _release(self, request_id: str, count: int | None = None) -> None:
        """Drop the first `count` (None: all) of a sequence's outstanding promises."""
        hashes = self._promised.get(request_id)
        if not hashes:
            return
        done = hashes if count is None else hashes[:count]
        for h in done:
            left = self._pending[h] - 1
            if left:
                self._pending[h] = left
            else:
                del self._pending[h]
        del hashes[: len(done)]

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks of `seq` that became full and computed since the last call."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        first = len(seq.block_hashes)
        for i in range(first, seq.num_computed_tokens // bs):
            chunk = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, chunk)
            seq.block_hashes.append(h)
            if h in self._cached:
                continue  # another sequence computed the same prefix first; keep that block cached
            block = self.blocks[seq.block_table[i]]
            block.hash = h
            block.token_ids = chunk
            self._cached[h] = block.block_id
        self._release(seq.request_id, len(seq.block_hashes) - first)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; blocks nobody holds go back to the free list."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.hash is None:
                    self._free.move_to_end(block_id, last=False)  # uncached: reuse before evicting
        seq.block_table.clear()
        seq.block_hashes.clear()
        self._release(seq.request_id)
        self._promised.pop(seq.request_id, None)

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            del self._cached[block.hash]  # evict: its contents are about to be overwritten
            block.hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id
