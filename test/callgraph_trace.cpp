// The calls a run makes, for test/test_syllabus.py's reading sets. The trainer is built with
// -finstrument-functions (Makefile: build/callgraph/train_gpt2cpu), so every function entry calls
// __cyg_profile_func_enter(callee, call site); this file, built without it, keeps each distinct
// (call site, callee) pair once and, at exit, writes them as hex addresses to
// $LLMC_CALLGRAPH.<pid> (nothing when the variable is unset). test_syllabus.py maps the addresses
// to functions with nm: the call site to the function holding it, the callee to its name.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <atomic>

#define NO_TRACE __attribute__((no_instrument_function))
static const size_t SLOTS = 1 << 20;   // open addressing; a run makes a few thousand distinct pairs
static std::atomic<uintptr_t> site_of[SLOTS], callee_of[SLOTS];
static std::atomic<int> full{0};

extern "C" NO_TRACE void __cyg_profile_func_enter(void* callee, void* site) {
    uintptr_t c = (uintptr_t)callee, s = (uintptr_t)site;
    static thread_local uintptr_t last_c, last_s;   // most calls repeat the one before (a loop's helper)
    if (c == last_c && s == last_s) { return; }
    last_c = c, last_s = s;
    size_t h = (size_t)((c * 0x9E3779B97F4A7C15ull) ^ (s * 0xC2B2AE3D27D4EB4Full)) & (SLOTS - 1);
    for (size_t probe = 0; probe < SLOTS; probe++, h = (h + 1) & (SLOTS - 1)) {
        uintptr_t cur = callee_of[h].load(std::memory_order_acquire);
        if (cur == 0) {   // claim the slot: the callee last, so that a reader never sees half a pair
            uintptr_t zero = 0;
            if (!site_of[h].compare_exchange_strong(zero, s)) {
                if (zero != s) { continue; }   // another pair took it
                while ((cur = callee_of[h].load(std::memory_order_acquire)) == 0) {}
                if (cur == c) { return; }
                continue;
            }
            callee_of[h].store(c, std::memory_order_release);
            return;
        }
        if (cur == c && site_of[h].load(std::memory_order_relaxed) == s) { return; }
    }
    full.store(1);
}
extern "C" NO_TRACE void __cyg_profile_func_exit(void*, void*) {}

NO_TRACE static void callgraph_write() {
    const char* base = getenv("LLMC_CALLGRAPH");
    if (!base) { return; }
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", base, (int)getpid());
    FILE* f = fopen(path, "w");
    if (!f) { return; }
    if (full.load()) { fprintf(f, "full\n"); }
    for (size_t i = 0; i < SLOTS; i++) {
        uintptr_t c = callee_of[i].load();
        if (c) { fprintf(f, "%lx %lx\n", (unsigned long)site_of[i].load(), (unsigned long)c); }
    }
    fclose(f);
}
__attribute__((constructor)) NO_TRACE static void callgraph_start() { atexit(callgraph_write); }
