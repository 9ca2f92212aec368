"""The built-in addition task of examples/addition_task.{h,c}, in Python, bit for bit (the same
token ids and the same xorshift64* problem stream), so a Python run can mirror a C test.

Vocabulary: 0..9 digits, 10 '+', 11 '=', 12 end of answer (stop token), 13 start of prompt.
A prompt is  <s> a + b =  and the answer is the digits of a + b followed by the stop token."""

PLUS, EQ, END, BOS, VOCAB = 10, 11, 12, 13, 16
_MASK = (1 << 64) - 1


def digits(x: int) -> list[int]:
    return [int(c) for c in str(x)]


def prompt(a: int, b: int) -> list[int]:
    return [BOS, *digits(a), PLUS, *digits(b), EQ]


def parse(p) -> tuple[int, int] | None:
    """(a, b) back from a prompt, None if malformed (numbers of at most 18 digits, as in C)."""
    p = list(p)
    if len(p) < 5 or p[0] != BOS:
        return None
    i, nums = 1, []
    for sep in (PLUS, EQ):
        start = i
        while i < len(p) and 0 <= p[i] <= 9 and i - start < 18:
            i += 1
        if i == start or i >= len(p) or p[i] != sep:
            return None
        nums.append(int("".join(map(str, p[start:i]))))
        i += 1
    return (nums[0], nums[1]) if i == len(p) else None


def reward(p, completion) -> float:
    """1.0 when the completion is exactly the digits of a + b and the stop token, else 0.0."""
    ab = parse(p)
    if ab is None:
        return 0.0
    return 1.0 if list(completion) == digits(ab[0] + ab[1]) + [END] else 0.0


class Rng:
    """add_rng: xorshift64* with the C code's constants."""

    def __init__(self, seed: int):
        self.s = seed & _MASK

    def rand(self, n: int) -> int:
        s = self.s
        s ^= s >> 12
        s ^= (s << 25) & _MASK
        s ^= s >> 27
        self.s = s
        return (((s * 2685821657736338717) & _MASK) >> 11) % n

    def batch(self, max_operand: int, n: int) -> list[list[int]]:
        out = []
        for _ in range(n):
            a = self.rand(max_operand + 1)
            b = self.rand(max_operand + 1)
            out.append(prompt(a, b))
        return out


def warmup_pair(rng: Rng, n: int) -> tuple[int, int]:
    """(a, b) as the C tests draw them with add_sequence(add_rand(r, n), add_rand(r, n), ...): C
    leaves the order of argument evaluation unspecified and GCC on x86-64 evaluates right to left,
    so b takes the first number. (Only needed to reproduce the C run's exact numbers.)"""
    b = rng.rand(n)
    a = rng.rand(n)
    return a, b


def sequence(a: int, b: int) -> tuple[list[int], list[float]]:
    """A teacher-forced sequence (prompt + answer + stop) and its loss mask (1 on the answer)."""
    p = prompt(a, b)
    toks = p + digits(a + b) + [END]
    return toks, [0.0] * len(p) + [1.0] * (len(toks) - len(p))
