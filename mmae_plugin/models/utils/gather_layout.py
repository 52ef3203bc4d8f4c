"""The slot layout of :mod:`.gather`: header words, what they say, and
the layout every rank derives from the gathered headers.

Pure bookkeeping on host integers and one host-to-device copy; the
collectives themselves are all in :mod:`.gather`.
"""
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: Dtypes a slot can carry; the header stores ``index + 1`` (0: another).
SLOT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16,
               torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
               torch.bool)
#: Largest number of dimensions of one row the header can describe.
MAX_ROW_DIMS = 4

# Header words (int64) at the start of every slot.
STATUS, ROWS, DTYPE, ROW_DIMS, CAPACITY = 0, 1, 2, 3, 4
SHAPE = 5  # MAX_ROW_DIMS words: the row shape, zero-filled
HEADER_WORDS = SHAPE + MAX_ROW_DIMS
HEADER_BYTES = 8 * HEADER_WORDS

#: Status bits of a slot header: why a rank's rows were left out.
TOO_MANY_ROWS = 1
OTHER_ROW_SHAPE = 2
OTHER_DTYPE = 4


# ------------------------------------------------------------------ headers
def _dtype_code(dtype: torch.dtype) -> int:
    return SLOT_DTYPES.index(dtype) + 1 if dtype in SLOT_DTYPES else 0


def _row_dims(x: Tensor) -> int:
    """Number of dimensions of one row, -1 when the header cannot say."""
    dims = x.dim() - 1
    return dims if 0 <= dims <= MAX_ROW_DIMS else -1


def header_words(x: Tensor,
                 capacity: Optional[int],
                 status: int = 0) -> List[int]:
    """The int64 header describing this rank's ``x``.

    Args:
        x: Local rows (N, ...).
        capacity: The configured capacity (``None``: -1 in the header).
        status: Status bits (0 when the rows are sent).

    Returns:
        :data:`HEADER_WORDS` ints.
    """
    words = [0] * HEADER_WORDS
    dims = _row_dims(x)
    words[STATUS] = status
    words[ROWS] = x.shape[0] if x.dim() else 0
    words[DTYPE] = _dtype_code(x.dtype)
    words[ROW_DIMS] = dims
    words[CAPACITY] = -1 if capacity is None else capacity
    if dims > 0:
        words[SHAPE:SHAPE + dims] = list(x.shape[1:])
    return words


def header_tensor(words: Sequence[int], device: torch.device) -> Tensor:
    """``words`` as an int64 tensor on ``device``, without a device wait.

    A plain host-to-GPU copy from pageable memory synchronises the stream;
    from pinned memory with ``non_blocking`` it is only queued (the caching
    host allocator keeps the pinned block until the copy has run).
    """
    host = torch.tensor(list(words), dtype=torch.int64)
    if device.type == 'cuda':
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _describe_rank(words: Sequence[int]) -> str:
    """``'5 rows of (4,) float32'`` from one rank's header."""
    dims = int(words[ROW_DIMS])
    shape = ('(more than %d dims)' % MAX_ROW_DIMS if dims < 0 else str(
        tuple(int(w) for w in words[SHAPE:SHAPE + dims])))
    code = int(words[DTYPE])
    dtype = str(SLOT_DTYPES[code - 1]).replace('torch.', '') if code \
        else 'an unsupported dtype'
    return f'{int(words[ROWS])} rows of {shape} {dtype}'


def describe_ranks(headers: Sequence[Sequence[int]]) -> str:
    """One phrase per rank: its row count, row shape and dtype."""
    return ', '.join(f'rank {rank}: {_describe_rank(words)}'
                     for rank, words in enumerate(headers))


# ------------------------------------------------------------------- layout
@dataclass(frozen=True)
class RowLayout:
    """What every rank's slot holds: ``capacity`` rows of one shape/dtype.

    Attributes:
        capacity: Rows reserved per rank.
        row_shape: Shape of one row.
        dtype: Dtype of the rows.
    """

    capacity: int
    row_shape: Tuple[int, ...]
    dtype: torch.dtype

    @property
    def payload_bytes(self) -> int:
        """Bytes of ``capacity`` rows."""
        numel = self.capacity * math.prod(self.row_shape)
        return numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def slot_bytes(self) -> int:
        """Header plus rows, rounded up to 8 bytes (int64 alignment)."""
        return HEADER_BYTES + 8 * math.ceil(self.payload_bytes / 8)

    def status_of(self, x: Tensor) -> int:
        """Status bits of local rows ``x``: 0 when they fit the slot."""
        status = 0
        if tuple(x.shape[1:]) != self.row_shape or x.dim() == 0:
            status |= OTHER_ROW_SHAPE
        if x.dtype != self.dtype:
            status |= OTHER_DTYPE
        if x.dim() and x.shape[0] > self.capacity:
            status |= TOO_MANY_ROWS
        return status


def agree_layout(headers: Sequence[Sequence[int]],
                 capacity: Optional[int],
                 what: str = 'rows') -> Optional[RowLayout]:
    """The layout every rank derives from the same gathered headers.

    Every rank calls this with identical ``headers``, so every rank returns
    the same layout or raises the same error.

    Args:
        headers: One :func:`header_words` list per rank, in rank order.
        capacity: The configured capacity, or ``None`` for the largest row
            count in ``headers``.
        what: What the rows are, for the error message.

    Returns:
        The layout, or ``None`` when no rank has a row and no capacity is
        configured (nothing to size the slots by yet).

    Raises:
        ValueError: Row shapes, dtypes or configured capacities differ
            across ranks, a rank's rows are not describable, or a rank has
            more rows than the configured capacity.
    """
    first = headers[0]
    kinds = {(tuple(w[DTYPE:ROW_DIMS + 1]), tuple(w[SHAPE:])) for w in headers}
    if len(kinds) > 1 or first[DTYPE] == 0 or first[ROW_DIMS] < 0:
        raise ValueError(
            f'cannot gather {what} across ranks: every rank must hold rows '
            'of the same shape and one dtype (float64, float32, float16, '
            f'bfloat16 or an integer type), got {describe_ranks(headers)}')
    if len({w[CAPACITY] for w in headers}) > 1:
        raise ValueError(f'cannot gather {what} across ranks: the configured '
                         'gather_capacity differs across ranks: '
                         f'{[int(w[CAPACITY]) for w in headers]}')
    most = max(int(w[ROWS]) for w in headers)
    if capacity is not None and most > capacity:
        raise ValueError(
            f'cannot gather {what} across ranks: gather_capacity={capacity} '
            f'but {describe_ranks(headers)}; set gather_capacity to at least '
            'the per-GPU batch size')
    if capacity is None and most == 0:
        return None
    dims = int(first[ROW_DIMS])
    row_shape = tuple(int(w) for w in first[SHAPE:SHAPE + dims])
    return RowLayout(
        capacity=most if capacity is None else capacity,
        row_shape=row_shape,
        dtype=SLOT_DTYPES[int(first[DTYPE]) - 1])
