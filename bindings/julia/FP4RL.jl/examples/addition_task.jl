# The addition task of fp4rl's demo (examples/addition_task.h in the repository), written in
# Julia so that a Julia trainer computes its own rewards: multi-digit addition with the answer
# checked exactly, in a 16-token vocabulary of its own (no tokenizer):
#   0..9 digits, 10 '+', 11 '=', 12 end of answer (the stop token), 13 start of prompt.
# A prompt is  <s> a + b =  (numbers without leading zeros); the answer is the digits of a + b
# followed by the stop token. Reward 1 for exactly that, else 0.
#
# Used by examples/grpo.jl and test/runtests.jl:  include("addition_task.jl"); using .AdditionTask

module AdditionTask

const PLUS = Int32(10)
const EQ = Int32(11)
const STOP = Int32(12)
const BOS = Int32(13)
const VOCAB = 16

"The decimal digits of `x >= 0`, most significant first, as token ids."
digit_tokens(x::Integer) = Int32.(reverse(digits(x)))   # digits(0) == [0]

"The prompt `<s> a + b =`."
prompt(a::Integer, b::Integer) = Int32[BOS; digit_tokens(a); PLUS; digit_tokens(b); EQ]

# A number at p[i...] (at most 18 digits, as the C task); returns (value or nothing, next index).
function _number(p::AbstractVector{<:Integer}, i::Int)
    start = i
    x = 0
    while i <= length(p) && 0 <= p[i] <= 9 && i - start < 18
        x = 10x + Int(p[i])
        i += 1
    end
    return (i > start ? x : nothing), i
end

"`(a, b)` of a well-formed prompt, else `nothing`."
function parse_prompt(p::AbstractVector{<:Integer})
    (length(p) >= 5 && p[1] == BOS) || return nothing
    a, i = _number(p, 2)
    (a !== nothing && i <= length(p) && p[i] == PLUS) || return nothing
    b, i = _number(p, i + 1)
    (b !== nothing && i <= length(p) && p[i] == EQ) || return nothing
    return i == length(p) ? (a, b) : nothing
end

"1.0 when `completion` is exactly the digits of a + b and the stop token, else 0.0."
function reward(prompt::AbstractVector{<:Integer}, completion::AbstractVector{<:Integer})
    ab = parse_prompt(prompt)
    ab === nothing && return 0.0
    want = [digit_tokens(ab[1] + ab[2]); STOP]
    return completion == want ? 1.0 : 0.0
end

"A deterministic stream of problems: the xorshift64* generator of the C task."
mutable struct Rng
    s::UInt64
end

"Uniform in `0:n-1`."
function rand_below(r::Rng, n::Integer)
    s = r.s
    s ⊻= s >> 12
    s ⊻= s << 25
    s ⊻= s >> 27
    r.s = s
    return Int(((s * 0x2545f4914f6cdd1d) >> 11) % UInt64(n))
end

"`n` prompts with operands in `0:max_operand`."
function batch(r::Rng, max_operand::Integer, n::Integer)
    return [begin
                a = rand_below(r, max_operand + 1)
                b = rand_below(r, max_operand + 1)
                prompt(a, b)
            end for _ in 1:n]
end

"A teacher-forced sequence (prompt, answer, stop) and its loss mask (1 on the answer)."
function sequence(a::Integer, b::Integer)
    p = prompt(a, b)
    tokens = [p; digit_tokens(a + b); STOP]
    mask = Float32[i > length(p) ? 1 : 0 for i in eachindex(tokens)]
    return tokens, mask
end

end # module
