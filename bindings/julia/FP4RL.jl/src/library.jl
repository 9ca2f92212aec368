# Locating libfp4rl, and the calls that need no handle.

# The path (or name) every ccall uses, found on first use. A Ref rather than a `const String`:
# a constant would be fixed when the package is precompiled, and the FP4RL_LIB of the process
# that runs the code must win.
const _LIBPATH = Ref{String}("")

"""
    libfp4rl() -> String

The shared library the binding calls: `ENV["FP4RL_LIB"]` when it is set and not empty (a full
path such as `/opt/fp4rl/lib/libfp4rl.so`, or a name), else `"libfp4rl"` when the dynamic loader
finds it (`LD_LIBRARY_PATH`, the system directories, `Libdl.DL_LOAD_PATH`). Throws an
`ErrorException` that says what to set when neither works.

Each `ccall` site resolves the library once, on its first call; set `FP4RL_LIB` before the first
call into the package.
"""
function libfp4rl()
    p = _LIBPATH[]
    isempty(p) || return p
    p = get(ENV, "FP4RL_LIB", "")
    if isempty(p)
        # find_library returns the name when dlopen can open it, "" otherwise; checking here
        # turns the loader's bare "could not load library" into an instruction.
        p = Libdl.find_library(["libfp4rl"])
        isempty(p) && error("FP4RL.jl: libfp4rl was not found. Set ENV[\"FP4RL_LIB\"] to the path of " *
                            "libfp4rl.so, or put its directory on LD_LIBRARY_PATH or in Libdl.DL_LOAD_PATH.")
    end
    _LIBPATH[] = p
    return p
end

"""
    version_number() -> UInt32

The linked library's `MAJOR * 10000 + MINOR * 100 + PATCH` (compare with
`FP4RL.VERSION_NUMBER`, the header this binding was written against).
"""
version_number() = ccall((:fp4rl_version_number, libfp4rl()), Cuint, ())

"""
    version_string() -> String

`"MAJOR.MINOR.PATCH"` of the linked library.
"""
version_string() = unsafe_string(ccall((:fp4rl_version_string, libfp4rl()), Ptr{UInt8}, ()))

"""
    library_version() -> VersionNumber

The linked library's version as a `VersionNumber`.
"""
library_version() = VersionNumber(version_string())

"""
    last_error() -> String

The calling thread's message for its last failed call into libfp4rl (`""` if none). The binding
reads it for you when it throws an [`FP4RLError`](@ref); this is for code that wants it anyway.
"""
last_error() = unsafe_string(ccall((:fp4rl_last_error, libfp4rl()), Ptr{UInt8}, ()))
