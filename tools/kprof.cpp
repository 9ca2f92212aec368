/*
 * kprof.cpp - a kernel-time profile of any CUDA program, at its real size, without ncu's replay:
 * a CUDA injection library (the driver loads it at cuInit when CUDA_INJECTION64_PATH names it)
 * that records every kernel, copy and memset through CUPTI's activity API and, at exit, prints
 * the GPU time per kernel name, sorted, with counts and shares, plus how busy the GPU was
 * (the sum of kernel times against the span from the first start to the last end).
 *
 *   nvcc -O2 -shared -Xcompiler -fPIC tools/kprof.cpp -o libkprof.so -lcupti
 *   CUDA_INJECTION64_PATH=$PWD/libkprof.so KPROF_TOP=40 ./program ...
 *
 * Output goes to stderr, or appended to the file KPROF_OUT names. A bench tool, not installed.
 */
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Stat {
    double ns = 0;
    long long count = 0;
};

std::mutex mu;
std::map<std::string, Stat> stats; // per kernel (demangled, template arguments kept), or "[memcpy HtoD]"...
uint64_t first_start = UINT64_MAX, last_end = 0;
double busy_ns = 0; // kernels only

std::string demangle(const char *name)
{
    int ok = 0;
    char *d = abi::__cxa_demangle(name, nullptr, nullptr, &ok);
    std::string s = ok == 0 && d ? d : name;
    free(d);
    // keep the function's name and its template arguments; drop the parameter list, the last
    // top-level "(...)" (names may also hold "(anonymous namespace)")
    if (!s.empty() && s.back() == ')') {
        int depth = 0;
        for (size_t i = s.size(); i-- > 0;) {
            if (s[i] == ')') depth++;
            if (s[i] == '(' && --depth == 0) return s.substr(0, i);
        }
    }
    return s;
}

void add(const std::string &key, uint64_t start, uint64_t end, bool kernel)
{
    Stat &s = stats[key];
    s.ns += (double)(end - start);
    s.count++;
    if (kernel) busy_ns += (double)(end - start);
    first_start = std::min(first_start, start);
    last_end = std::max(last_end, end);
}

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *size = 8 << 20;
    *buffer = static_cast<uint8_t *>(aligned_alloc(8, *size));
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid)
{
    std::lock_guard<std::mutex> lock(mu);
    CUpti_Activity *r = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            auto *k = reinterpret_cast<CUpti_ActivityKernel10 *>(r);
            add(demangle(k->name), k->start, k->end, true);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            auto *c = reinterpret_cast<CUpti_ActivityMemcpy6 *>(r);
            const char *kind = c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                               : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                               : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                                : "other";
            add(std::string("[memcpy ") + kind + "]", c->start, c->end, false);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            auto *s = reinterpret_cast<CUpti_ActivityMemset4 *>(r);
            add("[memset]", s->start, s->end, false);
            break;
        }
        default: break;
        }
    }
    free(buffer);
}

void report()
{
    cuptiActivityFlushAll(1);
    std::lock_guard<std::mutex> lock(mu);
    const char *path = getenv("KPROF_OUT");
    FILE *f = path ? fopen(path, "a") : nullptr;
    if (!f) f = stderr;
    const char *top_env = getenv("KPROF_TOP");
    const size_t top = top_env ? (size_t)atoll(top_env) : 40;
    std::vector<std::pair<std::string, Stat>> rows(stats.begin(), stats.end());
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.second.ns > b.second.ns; });
    double total = 0;
    long long launches = 0;
    for (const auto &r : rows) {
        total += r.second.ns;
        launches += r.second.count;
    }
    const double span = last_end > first_start ? (double)(last_end - first_start) : 0;
    fprintf(f, "kprof: %lld launches, GPU time %.1f ms (kernels %.1f ms), span %.1f ms, kernels busy %.1f%% of the span\n",
            launches, total / 1e6, busy_ns / 1e6, span / 1e6, span > 0 ? 100 * busy_ns / span : 0.0);
    fprintf(f, "kprof: %10s %6s %10s %8s  %s\n", "ms", "%", "count", "avg us", "kernel");
    for (size_t i = 0; i < rows.size() && i < top; i++) {
        const Stat &s = rows[i].second;
        std::string name = rows[i].first.size() > 150 ? rows[i].first.substr(0, 150) + "..." : rows[i].first;
        fprintf(f, "kprof: %10.2f %6.2f %10lld %8.1f  %s\n", s.ns / 1e6, total > 0 ? 100 * s.ns / total : 0.0, s.count,
                s.ns / 1e3 / (double)s.count, name.c_str());
    }
    if (f != stderr) fclose(f);
}

} // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void)
{
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    atexit(report);
    return 1;
}
