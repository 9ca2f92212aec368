# The test suite of FP4RL.jl: run with `julia --project=bindings/julia/FP4RL.jl -e 'using Pkg; Pkg.test()'`
# with FP4RL_LIB pointing at a built libfp4rl.so (or libfp4rl on the loader path).
#
# Fixtures come from the repository's tests/fixtures/qwen2 (override with FP4RL_FIXTURES).

using FP4RL
using Test

include(joinpath(@__DIR__, "..", "examples", "addition_task.jl"))
using .AdditionTask

const FIXTURES = get(ENV, "FP4RL_FIXTURES", normpath(joinpath(@__DIR__, "..", "..", "..", "..", "tests", "fixtures", "qwen2")))

# `f()` throws an FP4RLError with `status`; returns it for further checks.
function throws_status(f, status)
    err = try
        f()
        nothing
    catch e
        e
    end
    @test err isa FP4RLError
    err isa FP4RLError && @test err.status == status
    return err
end

# A minimal safetensors reader for the reference fixtures (F32 and I32 only): the tests need
# tensors the library did not produce to compare against.
function read_safetensors(path)
    bytes = read(path)
    n = Int(ltoh(reinterpret(UInt64, bytes[1:8])[1]))
    header = String(bytes[9:8+n])
    out = Dict{String,Array}()
    rx = r"\"([^\"]+)\":\{\"dtype\":\"(F32|I32)\",\"shape\":\[([0-9,]*)\],\"data_offsets\":\[([0-9]+),([0-9]+)\]\}"
    for m in eachmatch(rx, header)
        T = m[2] == "F32" ? Float32 : Int32
        cshape = isempty(m[3]) ? Int[] : parse.(Int, split(m[3], ","))
        lo, hi = parse(Int, m[4]), parse(Int, m[5])
        data = ltoh.(collect(reinterpret(T, bytes[8+n+lo+1:8+n+hi])))
        # row-major C shape -> the same bytes as a Julia array of the reversed size
        out[m[1]] = reshape(data, Tuple(reverse(cshape)))
    end
    return out
end

relerr(a, b) = sqrt(sum(abs2, Float64.(a) .- Float64.(b)) / max(sum(abs2, Float64.(b)), eps()))

const TINY = """{"model_type": "qwen2", "vocab_size": 16, "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 32, "tie_word_embeddings": true}"""

const SMALL = """{"model_type": "qwen2", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 32, "tie_word_embeddings": true}"""

# The reward of test_session.c: many 7s, learnable from scratch.
sevens(_, _, c) = count(==(7), c) / 4

function tiny_session(ctx; seed=3, kwargs...)
    p = QuantPolicy(PRESET_HIF4_RL; train_numerics=NUMERICS_FP4, rollout_numerics=NUMERICS_W4A4, resq=RESQ_2_4)
    m = Model(ctx, TINY; policy=p, seed=seed)
    s = RLSession(m; policy=p, stop_tokens=[AdditionTask.STOP], group_size=4, max_new_tokens=4, lr=1e-3, kwargs...)
    return m, s
end

@testset "FP4RL.jl" begin

@testset "library, version, names" begin
    @test version_number() == FP4RL.VERSION_NUMBER
    @test version_string() == "$(FP4RL.VERSION_MAJOR).$(FP4RL.VERSION_MINOR).$(FP4RL.VERSION_PATCH)"
    @test library_version() == VersionNumber(FP4RL.VERSION_MAJOR, FP4RL.VERSION_MINOR, FP4RL.VERSION_PATCH)
    for s in instances(Status)
        @test status_name(s) == "FP4RL_" * string(s)
    end
    @test status_name(1000) == "FP4RL_STATUS_UNKNOWN"
    @test dtype_name.(collect(instances(DType))) == ["f32", "bf16", "i32", "mxfp4", "nvfp4", "hif4", "mxfp8_e4m3"]
    @test dtype_name(99) == "unknown"
    # the keyword names of QuantPolicy are the library's parameter names
    for q in instances(QParam)
        @test qparam_name(q) == lowercase(string(q)[4:end])
    end
    @test qparam_name(FP4RL.QP_COUNT) === nothing
    @test length(instances(MParam)) == FP4RL.MP_COUNT
    @test length(instances(RLParam)) == FP4RL.RL_PARAM_COUNT
    @test length(metric_names()) > 20 && "reward/mean" in metric_names()
end

@testset "Context" begin
    ctx = Context()
    @test FP4RL.device(ctx) == DEVICE_CPU
    @test rng_state(ctx) == (seed = UInt64(0), offset = UInt64(0))
    set_seed!(ctx, 5)
    set_rng_offset!(ctx, 7)
    @test rng_state(ctx) == (seed = UInt64(5), offset = UInt64(7))
    set_seed!(ctx, 6)
    @test rng_state(ctx).offset == 0        # a new seed restarts the stream
    e = throws_status(() -> Context(DEVICE_CPU, 1), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("ordinal", e.message)
    throws_status(() -> Context(42), FP4RL.ERR_INVALID_ARGUMENT)
    # CUDA: a context, or the library's reason why not
    try
        cctx = Context(DEVICE_CUDA)
        @test FP4RL.device(cctx) == DEVICE_CUDA
        close(cctx)
    catch e
        @test e isa FP4RLError && e.status in (FP4RL.ERR_DEVICE, FP4RL.ERR_UNSUPPORTED)
    end
    # data parallelism: a plain context is rank 0 of 1; bad ranks and ids are rejected up front
    @test FP4RL.rank(ctx) == (rank = 0, world_size = 1)
    # memory statistics: a tensor is counted while it lives, the baseline comes back after it
    base = memory(ctx)
    @test base.reserved == base.in_use && base.peak >= base.in_use
    t = Tensor(ctx, zeros(Float32, 256, 256))
    @test memory(ctx).in_use >= base.in_use + 256 * 256 * 4
    close(t)
    m = memory(ctx)
    @test m.in_use == base.in_use && m.peak >= base.in_use + 256 * 256 * 4
    reset_peak_memory!(ctx)
    @test memory(ctx).peak == base.in_use
    throws_status(() -> distributed_context(0, 2, 2, zeros(UInt8, FP4RL.NCCL_UNIQUE_ID_BYTES)), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> distributed_context(0, 0, 1, zeros(UInt8, 4)), FP4RL.ERR_INVALID_ARGUMENT)
    try
        @test length(nccl_unique_id()) == FP4RL.NCCL_UNIQUE_ID_BYTES
    catch e
        @test e isa FP4RLError && e.status == FP4RL.ERR_UNSUPPORTED
    end
    @test isopen(ctx)
    close(ctx)
    close(ctx)                          # idempotent
    @test !isopen(ctx)
    e = throws_status(() -> set_seed!(ctx, 1), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("closed", e.message)
    @test sprint(show, ctx) == "FP4RL.Context(closed)"
end

@testset "QuantPolicy" begin
    p = QuantPolicy()
    @test p[QP_TILE_WEIGHT] == 0
    @test p[QP_FORMAT_WEIGHT] == Integer(DTYPE_MXFP4)
    @test p[QP_SEED] == -1
    @test p[QP_TRAIN_NUMERICS] == Integer(NUMERICS_FP4)
    @test p[QP_ROLLOUT_NUMERICS] == Integer(NUMERICS_W4A4)
    p[QP_TILE_WEIGHT] = 32
    @test getparam(p, QP_TILE_WEIGHT) == 32
    setparam!(p, QP_ROUNDING_GRADIENT, ROUND_STOCHASTIC)
    @test p[QP_ROUNDING_GRADIENT] == 1
    # an invalid value names the parameter, and leaves the policy unchanged
    e = throws_status(() -> (p[QP_TILE_WEIGHT] = 7), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("tile_weight", e.message)
    @test p[QP_TILE_WEIGHT] == 32
    throws_status(() -> setparam!(p, 99, 0), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> getparam(p, -1), FP4RL.ERR_INVALID_ARGUMENT)
    apply_preset!(p, PRESET_DEFAULT)
    @test p[QP_TILE_WEIGHT] == 0
    throws_status(() -> apply_preset!(p, 17), FP4RL.ERR_INVALID_ARGUMENT)
    # presets and keywords
    h = QuantPolicy(PRESET_HIF4_RL)
    @test h[QP_FORMAT_WEIGHT] == Integer(DTYPE_HIF4) && h[QP_RESQ] == Integer(RESQ_2_4)
    s = QuantPolicy(PRESET_STABLE_2D_MXFP4)
    @test s[QP_TILE_WEIGHT] == 32 && s[QP_SCALE_RULE] == Integer(SCALE_TRUNCATION_FREE)
    k = QuantPolicy(; format_weight=DTYPE_NVFP4, tile_weight=16, rollout_numerics=NUMERICS_W4A16)
    @test k[QP_FORMAT_WEIGHT] == Integer(DTYPE_NVFP4) && k[QP_TILE_WEIGHT] == 16
    @test_throws ArgumentError QuantPolicy(; no_such_knob=1)
    @test occursin("tile_weight = 16", sprint(show, k))
    close(k)
    close(k)
    @test !isopen(k)
    throws_status(() -> k[QP_TILE_WEIGHT], FP4RL.ERR_INVALID_ARGUMENT)
end

@testset "Tensor: dense, layout, errors" begin
    ctx = Context()
    A = Float32[1 2 3; 4 5 6]             # Julia (2, 3) = C [3, 2]
    t = Tensor(ctx, A)
    @test dtype(t) == DTYPE_F32
    @test ndims(t) == 2
    @test size(t) == (2, 3)
    @test cshape(t) == [3, 2]
    @test length(t) == 6
    @test nbytes(t) == 24
    @test FP4RL.context(t) === ctx
    @test Array(t) == A
    # the same bytes: C row r is Julia column r
    @test vec(Array(t)) == Float32[1, 4, 2, 5, 3, 6]
    # other element types and non-contiguous input
    @test Array(Tensor(ctx, Int32[1, -2, 3])) == Int32[1, -2, 3]
    @test dtype(Tensor(ctx, [1, 2, 3])) == DTYPE_I32
    @test Array(Tensor(ctx, view(A, 1, :))) == Float32[1, 2, 3]
    @test Array(Tensor(ctx, [1.5, 2.5])) == Float32[1.5, 2.5]
    bf = UInt16[0x3f80, 0xc000]            # bfloat16 1.0, -2.0
    tb = Tensor(ctx, bf)
    @test dtype(tb) == DTYPE_BF16 && Array(tb) == bf
    @test_throws ArgumentError Tensor(ctx, Float32[1, 2]; dtype=DTYPE_BF16)
    z = zeros(ctx, DTYPE_F32, 4, 3)
    @test size(z) == (4, 3) && cshape(z) == [3, 4] && all(iszero, Array(z))
    # errors come from the library, with its messages
    throws_status(() -> Tensor(ctx, zeros(Float32, ntuple(_ -> 1, 9))), FP4RL.ERR_SHAPE)
    throws_status(() -> Tensor(ctx, Float32[1, 2]; dtype=DTYPE_HIF4), FP4RL.ERR_DTYPE)
    throws_status(() -> zeros(ctx, DTYPE_F32, 0), FP4RL.ERR_SHAPE)
    throws_status(() -> copyto!(Vector{Float32}(undef, 2), t), FP4RL.ERR_SHAPE)
    @test_throws ArgumentError copyto!(Vector{Int32}(undef, 6), t)
    throws_status(() -> quant_info(t), FP4RL.ERR_DTYPE)
    # close: idempotent, and a closed tensor cannot be used
    close(t)
    close(t)
    @test !isopen(t)
    throws_status(() -> Array(t), FP4RL.ERR_INVALID_ARGUMENT)
    @test sprint(show, t) == "FP4RL.Tensor(closed)"
end

@testset "HiF4 spec vector D" begin
    ctx = Context()
    x = Float32[(j - 32) / 16 for j in 0:63]
    t = Tensor(ctx, x)
    q = quantize(t, DTYPE_HIF4; role=ROLE_ACTIVATION)
    @test dtype(q) == DTYPE_HIF4
    @test quant_info(q) == (tile = 0, codes_bytes = 32, scales_bytes = 4, tensor_scale = 1.0f0)
    @test scales(q) == UInt32[0xEC3FC3B9]
    d = Array(dequantize(q))
    @test d[1] == -1.875f0
    # every element near its source (the spec's bound: within 0.625 of a grid step of 0.3125*4)
    @test maximum(abs.(d .- x)) <= 0.625 * 0.3125
    # codes and scales round-trip through import
    c = codes(q)
    @test length(c) == 32
    r = import_quantized(ctx, DTYPE_HIF4, 64, c, scales(q))
    @test Array(dequantize(r)) == d
    @test codes(r) == c
    # the library validates imports
    e = throws_status(() -> import_quantized(ctx, DTYPE_HIF4, 64, c[1:31], scales(q)), FP4RL.ERR_SHAPE)
    @test occursin("32 bytes of codes", e.message)
    throws_status(() -> import_quantized(ctx, DTYPE_NVFP4, 64, c, zeros(UInt8, 4); tensor_scale=0.0f0), FP4RL.ERR_CORRUPT)
    # BF16 dequantization
    @test dtype(dequantize(q, DTYPE_BF16)) == DTYPE_BF16
    @test_throws FP4RLError Array(q)    # a quantized tensor has no dense host form
end

@testset "quantize: formats, 2D tiles, transpose, matmul, quant_error" begin
    ctx = Context()
    set_seed!(ctx, 11)
    K, M, N = 64, 3, 5
    a = Float32[sin(0.37f0 * i + 0.11f0 * j) for i in 1:K, j in 1:M]    # Julia (K, M) = C [M, K]
    b = Float32[cos(0.23f0 * i - 0.07f0 * j) for i in 1:K, j in 1:N]    # C [N, K]
    ta, tb = Tensor(ctx, a), Tensor(ctx, b)
    # dense GEMM: C[M,N] = A B^T, i.e. transpose(b) * a in Julia terms
    c = matmul(ta, tb)
    @test size(c) == (N, M)
    @test Array(c) ≈ transpose(b) * a rtol=1e-5
    # quantized operands are dequantized exactly before the FP32 product
    for fmt in (DTYPE_MXFP4, DTYPE_NVFP4, DTYPE_HIF4, DTYPE_MXFP8_E4M3)
        qa, qb = quantize(ta, fmt), quantize(tb, fmt)
        @test dtype(qa) == fmt && size(qa) == size(ta)
        da, db = Array(dequantize(qa)), Array(dequantize(qb))
        @test Array(matmul(qa, qb)) ≈ transpose(db) * da rtol=1e-5
        e = quant_error(ta, qa)
        @test 0 < e.rel_mse < 0.05
        @test e.nan_block_frac == 0
    end
    c2 = zeros(ctx, DTYPE_F32, N, M)
    @test matmul!(c2, ta, tb) === c2
    throws_status(() -> matmul!(zeros(ctx, DTYPE_F32, 2, 2), ta, tb), FP4RL.ERR_SHAPE)
    # 2D tiles: transpose is a reshuffle equal to quantizing the transposed source
    p2 = QuantPolicy(; tile_weight=32)
    w = Float32[sin(0.1f0 * i * j) for i in 1:64, j in 1:32]
    tw = Tensor(ctx, w)
    q2 = quantize(tw, DTYPE_MXFP4; policy=p2, role=ROLE_WEIGHT)
    @test quant_info(q2).tile == 32
    qt = transpose(q2)
    @test size(qt) == (32, 64)
    @test Array(dequantize(qt)) == permutedims(Array(dequantize(q2)))
    @test Array(transpose(tw)) == permutedims(w)
    throws_status(() -> transpose(quantize(tw, DTYPE_MXFP4)), FP4RL.ERR_UNSUPPORTED)
    # stochastic rounding advances the context's random offset by one per call
    ps = QuantPolicy(; rounding_activation=ROUND_STOCHASTIC)
    o = rng_state(ctx).offset
    quantize(ta, DTYPE_MXFP4; policy=ps, role=ROLE_ACTIVATION)
    @test rng_state(ctx).offset == o + 1
    # a NaN makes its block NaN, reported by quant_error
    xn = copy(a)
    xn[1, 1] = NaN32
    tn = Tensor(ctx, xn)
    @test quant_error(tn, quantize(tn, DTYPE_MXFP4)).nan_block_frac > 0
    # tensors of another context are refused
    other = Context()
    e = throws_status(() -> quantize(ta, DTYPE_MXFP4; ctx=other), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("another context", e.message)
    throws_status(() -> quantize(ta, DTYPE_F32), FP4RL.ERR_DTYPE)
end

@testset "zero copy: wrap, data_pointer, param_tensor, set_stream!" begin
    ctx = Context()
    A = Float32[1 2 3; 4 5 6]                 # Julia 2x3 = C shape [3, 2]
    t = wrap(ctx, A)
    @test data_pointer(t) == Ptr{Cvoid}(pointer(A))   # no copy
    @test cshape(t) == [3, 2]
    A[2, 3] = -1.0f0                          # the library sees Julia's writes
    @test Array(t)[2, 3] == -1.0f0
    @test_throws FP4RLError wrap(ctx, Ptr{Cvoid}(pointer(A)), DTYPE_HIF4, 2, 3; owner=A)
    q = quantize(Tensor(ctx, ones(Float32, 32, 1)), DTYPE_MXFP4)
    @test_throws FP4RLError data_pointer(q)
    m = Model(ctx, TINY; seed=1)
    name = "model.norm.weight"
    v = param_tensor(m, name)
    @test Array(v) == get_param(m, name)
    unsafe_store!(Ptr{Float32}(data_pointer(v)), 0.5f0)   # a write through the view is the weight
    @test get_param(m, name)[1] == 0.5f0
    @test_throws FP4RLError param_tensor(m, "no.such.weight")
    set_stream!(ctx, C_NULL)
    @test_throws FP4RLError set_stream!(ctx, Ptr{Cvoid}(UInt(8)))
end

@testset "Model: save_pretrained round trip, sharded; eos as default stop tokens" begin
    ctx = Context()
    m = from_pretrained(ctx, joinpath(FIXTURES, "gqa"))
    dir = mktempdir()
    one, shards = joinpath(dir, "one"), joinpath(dir, "shards")
    save_pretrained(m, one)
    save_pretrained(m, shards; max_shard_bytes=40000)
    @test isfile(joinpath(shards, "model.safetensors.index.json"))
    for d in (one, shards)
        r = from_pretrained(ctx, d)
        @test all(get_param(r, n) == get_param(m, n) for n in param_names(m))
    end
    @test isempty(stop_tokens(RLSession(m)))
    write(joinpath(one, "generation_config.json"), "{\"eos_token_id\": [3, 9]}")
    s = RLSession(from_pretrained(ctx, one))
    @test stop_tokens(s) == Int32[3, 9]
    set_stop_tokens!(s, [4])
    @test stop_tokens(s) == Int32[4]
    mine = joinpath(dir, "mine")
    mkpath(mine)
    write(joinpath(mine, "notes.txt"), "keep")
    throws_status(() -> save_pretrained(m, mine), FP4RL.ERR_INVALID_ARGUMENT)
    @test read(joinpath(mine, "notes.txt"), String) == "keep"
end

@testset "Model: HF parity on the gqa fixture, I/O, errors" begin
    ctx = Context()
    p32 = QuantPolicy(; train_numerics=NUMERICS_FP32)
    m = from_pretrained(ctx, joinpath(FIXTURES, "gqa"); policy=p32)
    @test m[MI_VOCAB_SIZE] == 96
    @test m[MI_HIDDEN_SIZE] == 64
    @test m[MI_INTERMEDIATE_SIZE] == 112
    @test m[MI_NUM_LAYERS] == 2
    @test m[MI_NUM_HEADS] == 4 && m[MI_NUM_KV_HEADS] == 2 && m[MI_HEAD_DIM] == 16
    @test m[MI_TIED_EMBEDDINGS] == 0
    @test m[MI_STEP] == 0
    # parameters: C shape [out, in] is a Julia (in, out) matrix, the safetensors bytes unchanged
    weights = read_safetensors(joinpath(FIXTURES, "gqa", "model.safetensors"))
    @test param_shape(m, "model.layers.0.self_attn.k_proj.weight") == [32, 64]
    names = param_names(m)
    @test length(names) == m[MI_NUM_TENSORS] && names[1] == "model.embed_tokens.weight"
    @test sum(prod(param_shape(m, n)) for n in names) == m[MI_NUM_PARAMETERS]
    kp = get_param(m, "model.layers.0.self_attn.k_proj.weight")
    @test size(kp) == (64, 32)
    @test kp == weights["model.layers.0.self_attn.k_proj.weight"]
    @test get_param(m, "model.norm.weight") == weights["model.norm.weight"]
    # logits, loss and gradients against HF transformers (the fixture's reference)
    ref = read_safetensors(joinpath(FIXTURES, "gqa", "reference.safetensors"))
    ids = ref["input_ids"]                    # C [B, T] -> Julia (T, B): one sequence per column
    lens = ref["lengths"]
    T, B = size(ids)
    lg = logits(m, ids; lengths=lens)
    @test size(lg) == (96, T, B)
    @test relerr(lg, ref["logits"]) <= 1e-4
    loss = compute_gradients!(m, ids; lengths=lens)
    @test abs(loss - ref["loss"][1]) <= 1e-5 * abs(ref["loss"][1])
    ngrad = 0
    for (k, v) in ref
        startswith(k, "grad.") || continue
        @test relerr(get_grad(m, k[6:end]), v) <= 1e-3
        ngrad += 1
    end
    @test ngrad >= 5
    lp = token_logprobs(m, ids; lengths=lens)
    @test size(lp) == (T, B) && all(lp[1, :] .== 0) && all(lp .<= 0)
    # a ragged batch is padded for you
    seqs = [ids[1:lens[b], b] for b in 1:B]
    @test logits(m, seqs) ≈ lg rtol=1e-6
    # save / load round trip, hyper-parameters, set_param!
    dir = mktempdir()
    path = joinpath(dir, "w.safetensors")
    save(m, path)
    m2 = Model(ctx, read(joinpath(FIXTURES, "gqa", "config.json"), String); policy=p32, seed=99)
    @test logits(m2, ids; lengths=lens) != lg
    load!(m2, path)
    @test logits(m2, ids; lengths=lens) == lg
    m2[MP_LR] = 2e-3
    @test m2[MP_LR] == 2e-3
    set_hparam!(m2, MP_GRAD_CLIP, 1.0)
    @test hparam(m2, MP_GRAD_CLIP) == 1.0
    throws_status(() -> (m2[MP_LR] = -1.0), FP4RL.ERR_INVALID_ARGUMENT)
    w = get_param(m2, "model.norm.weight")
    set_param!(m2, "model.norm.weight", 2 .* w)
    @test get_param(m2, "model.norm.weight") == 2 .* w
    @test_throws DimensionMismatch set_param!(m2, "model.layers.0.self_attn.k_proj.weight", zeros(Float32, 32, 64))
    set_policy!(m2, QuantPolicy(PRESET_HIF4_RL))
    @test logits(m2, ids; lengths=lens) != logits(m, ids; lengths=lens)
    # errors: the library's statuses and messages
    throws_status(() -> load!(m2, "/nonexistent/w.safetensors"), FP4RL.ERR_IO)
    e = throws_status(() -> load!(m2, joinpath(FIXTURES, "tied", "model.safetensors")), FP4RL.ERR_CORRUPT)
    @test occursin("model.", e.message)
    throws_status(() -> save(m, path; dtype=DTYPE_HIF4), FP4RL.ERR_DTYPE)
    throws_status(() -> get_param(m, "model.nope"), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> Model(ctx, "{not json"), FP4RL.ERR_CORRUPT)
    @test_throws FP4RLError Model(ctx, """{"model_type": "llama"}""")
    throws_status(() -> logits(m, Int32[1 1000]'), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> logits(m, ids; lengths=zeros(Int32, B)), FP4RL.ERR_INVALID_ARGUMENT)
    @test_throws DimensionMismatch logits(m, ids; lengths=Int32[1])
    @test_throws ArgumentError Model(ctx, "{\"model_type\": \"qwen2\"\0}")   # a NUL cannot reach C
    rm(dir; recursive=true)
end

@testset "Model: supervised training on the addition task" begin
    ctx = Context()
    set_seed!(ctx, 5)
    m = Model(ctx, TINY; policy=QuantPolicy(PRESET_HIF4_RL), seed=1)
    m[MP_LR] = 3e-3
    rng_ = AdditionTask.Rng(77)
    batch() = [AdditionTask.sequence(AdditionTask.rand_below(rng_, 10), AdditionTask.rand_below(rng_, 10)) for _ in 1:32]
    losses = Float64[]
    for _ in 1:40
        seqs = batch()
        r = train_step!(m, first.(seqs); loss_mask=last.(seqs))
        @test r.grad_norm > 0
        push!(losses, r.loss)
    end
    @test sum(losses[end-4:end]) < 0.8 * sum(losses[1:5])
    @test m[MI_STEP] == 40
end

@testset "RLSession: parameters, split API, metrics, checkpoints" begin
    ctx = Context()
    set_seed!(ctx, 5)
    m, s = tiny_session(ctx; seed=6)
    @test s[RL_GROUP_SIZE] == 4 && s[RL_MAX_NEW_TOKENS] == 4 && s[RL_LR] == 1e-3
    s[RL_CLIP_HIGH] = 0.28
    @test getparam(s, RL_CLIP_HIGH) == 0.28
    e = throws_status(() -> (s[RL_GROUP_SIZE] = 1), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("group_size", e.message)
    throws_status(() -> setparam!(s, 99, 1.0), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> set_stop_tokens!(s, [77]), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> train!(s), FP4RL.ERR_INVALID_ARGUMENT)        # no rollout yet
    throws_status(() -> metric(s, "nope"), FP4RL.ERR_INVALID_ARGUMENT)
    @test_throws ArgumentError RLSession(m; no_such_param=1)
    # the split form
    prompts = AdditionTask.batch(AdditionTask.Rng(3), 9, 3)
    @test rollout!(s, prompts) == 12
    @test num_completions(s) == 12
    cs = completions(s)
    @test [c.prompt_index for c in cs] == repeat(1:3, inner=4)
    @test all(1 <= length(c.tokens) <= 4 && length(c.logprobs) == length(c.tokens) for c in cs)
    @test all(all(c.logprobs .<= 0) && all(isfinite, c.logprobs) for c in cs)
    throws_status(() -> completion(s, 13), FP4RL.ERR_INVALID_ARGUMENT)
    throws_status(() -> set_rewards!(s, [0.0, 1.0]), FP4RL.ERR_SHAPE)
    set_rewards!(s, [sevens(c.prompt_index, prompts[c.prompt_index], c.tokens) for c in cs])
    mt = train!(s)
    @test num_completions(s) == 0
    @test step_count(s) == 1
    @test mt["lr"] ≈ 1e-3
    @test mt["grad_norm"] > 0 && mt["entropy"] > 0
    @test Set(keys(mt)) == Set(metric_names())
    js = metrics_json(s)
    @test occursin("\"step\": 1", js) && all(occursin(n, js) for n in metric_names())
    # step! with a closure, a metrics file, a checkpoint and a bit-identical resume
    dir = mktempdir()
    set_metrics_file!(s, joinpath(dir, "metrics.jsonl"))
    seen = Ref(0)
    r = step!(s, prompts) do i, p, c
        seen[] += 1
        @assert p == prompts[i]
        sevens(i, p, c)
    end
    @test seen[] == 12 && r["reward/mean"] == metric(s, "reward/mean")
    set_metrics_file!(s, nothing)
    @test length(readlines(joinpath(dir, "metrics.jsonl"))) == 1
    ck = joinpath(dir, "ckpt")
    save(s, ck)
    more = [AdditionTask.batch(AdditionTask.Rng(10 + k), 9, 4) for k in 1:2]
    for pr in more
        step!(sevens, s, pr)
    end
    want = get_param(m, "model.layers.1.mlp.down_proj.weight")
    ctx2 = Context()
    set_seed!(ctx2, 999)
    m2 = Model(ctx2, TINY; seed=123)
    s2 = RLSession(ctx2, m2; stop_tokens=AdditionTask.STOP)
    load!(s2, ck)
    @test step_count(s2) == 2
    for pr in more
        step!(sevens, s2, pr)
    end
    @test get_param(m2, "model.layers.1.mlp.down_proj.weight") == want
    @test metric(s2, "reward/mean") == metric(s, "reward/mean")
    throws_status(() -> load!(s2, "/nonexistent/ckpt"), FP4RL.ERR_IO)
    # a session of another context's model is refused
    e = throws_status(() -> RLSession(ctx, m2), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("another context", e.message)
    rm(dir; recursive=true)
end

@testset "reward functions: errors inside the callback" begin
    ctx = Context()
    set_seed!(ctx, 5)
    m, s = tiny_session(ctx; seed=4)
    prompts = AdditionTask.batch(AdditionTask.Rng(2), 9, 4)
    step!(sevens, s, prompts)                              # one real step first
    name = "model.layers.0.mlp.up_proj.weight"
    before = get_param(m, name)
    # a closure that throws: FP4RLError with the CALLBACK status, the library's message, the Julia exception
    calls = Ref(0)
    e = throws_status(FP4RL.ERR_CALLBACK) do
        step!(s, prompts) do i, p, c
            calls[] += 1
            calls[] == 5 && error("boom at call 5")
            0.5
        end
    end
    @test calls[] == 5
    @test occursin("completion 4", e.message)
    @test occursin("boom at call 5", e.message)
    @test e.cause !== nothing && e.cause[1] isa ErrorException
    @test occursin("boom at call 5", sprint(showerror, e))
    # NaN and Inf rewards: rejected by the library
    e = throws_status(() -> step!((i, p, c) -> NaN, s, prompts), FP4RL.ERR_CALLBACK)
    @test occursin("finite", e.message) && occursin("completion 0", e.message)
    throws_status(() -> step!((i, p, c) -> Inf, s, prompts), FP4RL.ERR_CALLBACK)
    # a reward that is not a number
    e = throws_status(() -> step!((i, p, c) -> "one", s, prompts), FP4RL.ERR_CALLBACK)
    @test e.cause[1] isa MethodError
    # calling into the session's context from inside the reward function is refused
    e = throws_status(() -> step!((i, p, c) -> metric(s, "reward/mean"), s, prompts), FP4RL.ERR_CALLBACK)
    @test e.cause[1] isa FP4RLError && e.cause[1].status == FP4RL.ERR_INVALID_ARGUMENT
    # every failed step left the model and the step count exactly as they were
    @test get_param(m, name) == before
    @test step_count(s) == 1
    @test m[MI_STEP] == 1
    # a reward function may use another context
    other = Context()
    ot = Tensor(other, Float32[1, 2])
    step!((i, p, c) -> sum(Array(ot)) / 3, s, prompts)
    @test metric(s, "reward/mean") == 1.0
    @test step_count(s) == 2
    # errors of the library's own argument checks
    throws_status(() -> step!(sevens, s, Vector{Int32}[]), FP4RL.ERR_INVALID_ARGUMENT)
    e = throws_status(() -> step!(sevens, s, [Int32[]]), FP4RL.ERR_INVALID_ARGUMENT)
    @test occursin("empty", e.message)
    e = throws_status(() -> step!(sevens, s, [zeros(Int32, 30)]), FP4RL.ERR_SHAPE)
    @test occursin("context", e.message)
    throws_status(() -> step!(sevens, s, [Int32[1, 99, 2]]), FP4RL.ERR_INVALID_ARGUMENT)
    @test_throws DimensionMismatch step!(sevens, s, (Int32[1, 2], [0, 5]))
    @test step_count(s) == 2
end

@testset "handles: lifetimes, finalizers, no double free" begin
    # a context closed while its tensors and models live: they keep working, and the C
    # context goes with the last of them
    ctx = Context()
    t = Tensor(ctx, Float32[1, 2, 3])
    m = Model(ctx, TINY)
    s = RLSession(m)
    close(ctx)
    @test !isopen(ctx) && ctx.ptr != C_NULL && ctx.children == 3
    @test Array(t) == Float32[1, 2, 3]
    q = quantize(t, DTYPE_HIF4)            # the implied context of t still works
    @test dtype(q) == DTYPE_HIF4 && ctx.children == 4
    close(q)
    throws_status(() -> Tensor(ctx, Float32[1]), FP4RL.ERR_INVALID_ARGUMENT)   # but the context itself is closed
    close(m)                               # the session still borrows the model
    @test m.ptr != C_NULL && step_count(s) == 0
    close(t)
    @test ctx.ptr != C_NULL
    close(s)                               # the last dependent: session, model, context go
    @test s.ptr == C_NULL && m.ptr == C_NULL && ctx.ptr == C_NULL
    close(s); close(m); close(ctx); destroy!(t)
    # garbage collection in any order, and a loop of create/destroy
    function churn()
        c = Context()
        for i in 1:1000
            x = Tensor(c, rand(Float32, 8))
            q = quantize(x, DTYPE_MXFP4)
            isodd(i) && close(q)           # half closed by hand, the rest left to the collector
        end
        mm = Model(c, TINY)
        RLSession(mm)
        return nothing                     # everything unreachable from here
    end
    for _ in 1:3
        churn()
        GC.gc(true)
    end
    # objects dropped while their context is busy are freed later, not during the call
    c2 = Context()
    m2, s2 = tiny_session(c2)
    drop(c) = (for _ in 1:50; Tensor(c, rand(Float32, 4)); end; nothing)   # unreachable once it returns
    drop(c2)
    step!(s2, AdditionTask.batch(AdditionTask.Rng(1), 9, 2)) do i, p, c
        GC.gc(false)                       # finalizers of c2's tensors must not run in here
        sevens(i, p, c)
    end
    GC.gc(true)
    GC.gc(true)
    @test c2.children == 2                 # only m2 and s2 are left
    @test true                             # and nothing crashed
end

@testset "end to end: FP4 RL with a Julia reward raises the held-out reward" begin
    # the setup of test_session.c's test_rl_raises_reward, with the reward computed in Julia
    ctx = Context()
    set_seed!(ctx, 5)
    p = QuantPolicy(PRESET_HIF4_RL; train_numerics=NUMERICS_FP4, rollout_numerics=NUMERICS_W4A4, resq=RESQ_2_4)
    m = Model(ctx, SMALL; policy=p, seed=7)
    s = RLSession(m; stop_tokens=[AdditionTask.STOP])
    evals = RLSession(m; stop_tokens=[AdditionTask.STOP], group_size=8, max_new_tokens=4)
    m[MP_LR] = 3e-3
    rng_ = AdditionTask.Rng(77)
    eval_prompts = AdditionTask.batch(AdditionTask.Rng(78), 9, 128)
    for _ in 1:150                         # supervised warm-up until partly right
        seqs = [AdditionTask.sequence(AdditionTask.rand_below(rng_, 10), AdditionTask.rand_below(rng_, 10)) for _ in 1:32]
        train_step!(m, first.(seqs); loss_mask=last.(seqs))
    end
    # mean reward of 8 samples per held-out prompt, with fixed sampling randomness
    function held_out()
        evals[RL_SEED] = 4242
        n = rollout!(evals, eval_prompts)
        return sum(AdditionTask.reward(eval_prompts[c.prompt_index], c.tokens) for c in completions(evals)) / n
    end
    r0 = held_out()
    s[RL_GROUP_SIZE] = 8
    s[RL_MAX_NEW_TOKENS] = 4
    s[RL_LR] = 1e-3
    s[RL_CLIP_HIGH] = 0.28
    rewards = Float64[]
    for _ in 1:24
        prompts = AdditionTask.batch(rng_, 9, 32)
        mt = step!(s, prompts) do i, prompt, completion
            AdditionTask.reward(prompt, completion)
        end
        push!(rewards, mt["reward/mean"])
    end
    r1 = held_out()
    @info "FP4 RL from Julia: held-out mean reward $(round(r0; digits=3)) after the warm-up, $(round(r1; digits=3)) after 24 steps"
    @test r1 > r0 + 0.03
    @test step_count(s) == 24
end

end # testset
