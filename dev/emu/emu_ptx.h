// The PTX instructions the project's kernels use, as warp-wide functions (dev/emu/README.md).
//
// cudaemu.py turns an inline-asm statement into a call of the function named after its
// instruction, dots replaced by underscores, with the operands in the order the instruction
// text lists them: outputs as pointers (their first appearance), inputs as values. So
//   asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7},
//                 {%8,%9}, {%0,%1,%2,%3};" : "+f"(c[0]), ... : "r"(a[0]), ...)
// becomes
//   ::emu::ptx::mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(&c[0], ..., a[0], ..., c[0], ...)
// An instruction with no function here does not compile: nothing runs that was not written.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type";
// g = lane / 4, c = lane % 4; each .b32 register holds two bf16, the lower column in the low
// 16 bits):
//   A 16x16 row-major: a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]
//   B 16x8 col-major : b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
//   C, D 16x8        : c0, c1 = C[g][2c..2c+1], c2, c3 = C[g+8][2c..2c+1]
// ldmatrix.m8n8: lanes 8i..8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i;
// lane L receives in register i the elements (L/4, 2(L%4)..+1) of matrix i, or with .trans
// the elements (2(L%4)..+1, L/4), i.e. of the transposed matrix.
#pragma once

#include <stdint.h>
#include <string.h>

namespace emu {
namespace ptx {

inline float bf16_lo(uint32_t r) { return __uint_as_float(r << 16); }
inline float bf16_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = A B + C, fp32 accumulation
struct MmaIn { uint32_t a[4]; uint32_t b[2]; };
inline float mma_a(const MmaIn* lanes, int r, int k) {   // A[r][k] from the lane that holds it
    const MmaIn& l = lanes[(r % 8) * 4 + (k % 8) / 2];
    uint32_t reg = l.a[(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
    return k % 2 ? bf16_hi(reg) : bf16_lo(reg);
}
inline float mma_b(const MmaIn* lanes, int k, int n) {   // B[k][n]
    const MmaIn& l = lanes[n * 4 + (k % 8) / 2];
    uint32_t reg = l.b[k >= 8 ? 1 : 0];
    return k % 2 ? bf16_hi(reg) : bf16_lo(reg);
}
inline void mma_m16n8k16_compute(const void* deposits, int stride, int lane, void* out, const void* arg) {
    const float* c = (const float*)arg;   // this lane's C fragment
    float* d = (float*)out;
    MmaIn lanes[32];
    for (int i = 0; i < 32; i++) { memcpy(&lanes[i], (const char*)deposits + (size_t)i * stride, sizeof(MmaIn)); }
    int g = lane / 4, cc = lane % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + (e >= 2 ? 8 : 0), col = 2 * cc + e % 2;
        float acc = c[e];
        for (int k = 0; k < 16; k++) { acc += mma_a(lanes, row, k) * mma_b(lanes, k, col); }
        d[e] = acc;
    }
}
inline void mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(float* d0, float* d1, float* d2, float* d3,
        uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
        float c0, float c1, float c2, float c3) {
    MmaIn in = {{a0, a1, a2, a3}, {b0, b1}};
    float c[4] = {c0, c1, c2, c3}, d[4];
    warp_collective("mma.sync.m16n8k16", 0xffffffffu, &in, (int)sizeof(in), d, mma_m16n8k16_compute, c);
    *d0 = d[0]; *d1 = d[1]; *d2 = d[2]; *d3 = d[3];
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
struct LdmatrixArg { int nmat; int trans; };
inline void ldmatrix_compute(const void* deposits, int stride, int lane, void* out, const void* arg) {
    const LdmatrixArg* a = (const LdmatrixArg*)arg;
    uint32_t* r = (uint32_t*)out;
    for (int i = 0; i < a->nmat; i++) {
        uint16_t h[2];
        for (int e = 0; e < 2; e++) {
            int row = a->trans ? 2 * (lane % 4) + e : lane / 4;
            int col = a->trans ? lane / 4 : 2 * (lane % 4) + e;
            uint32_t addr;
            memcpy(&addr, (const char*)deposits + (size_t)(8 * i + row) * stride, 4);
            if (addr % 16 != 0) { trap("ldmatrix: a row address is not 16-byte aligned"); }
            memcpy(&h[e], (const char*)shared_pointer(addr) + 2 * col, 2);
        }
        r[i] = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
    }
}
inline void ldmatrix_run(const char* kind, int nmat, int trans, uint32_t addr, uint32_t* r) {
    LdmatrixArg a{nmat, trans};
    warp_collective(kind, 0xffffffffu, &addr, 4, r, ldmatrix_compute, &a);
}
inline void ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16(uint32_t* r0, uint32_t* r1, uint32_t* r2, uint32_t* r3, uint32_t addr) {
    uint32_t r[4];
    ldmatrix_run("ldmatrix.x4.trans", 4, 1, addr, r);
    *r0 = r[0]; *r1 = r[1]; *r2 = r[2]; *r3 = r[3];
}
inline void ldmatrix_sync_aligned_m8n8_x4_shared_b16(uint32_t* r0, uint32_t* r1, uint32_t* r2, uint32_t* r3, uint32_t addr) {
    uint32_t r[4];
    ldmatrix_run("ldmatrix.x4", 4, 0, addr, r);
    *r0 = r[0]; *r1 = r[1]; *r2 = r[2]; *r3 = r[3];
}
inline void ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16(uint32_t* r0, uint32_t* r1, uint32_t addr) {
    uint32_t r[4];
    ldmatrix_run("ldmatrix.x2.trans", 2, 1, addr, r);
    *r0 = r[0]; *r1 = r[1];
}
inline void ldmatrix_sync_aligned_m8n8_x2_shared_b16(uint32_t* r0, uint32_t* r1, uint32_t addr) {
    uint32_t r[4];
    ldmatrix_run("ldmatrix.x2", 2, 0, addr, r);
    *r0 = r[0]; *r1 = r[1];
}
inline void ldmatrix_sync_aligned_m8n8_x1_trans_shared_b16(uint32_t* r0, uint32_t addr) {
    uint32_t r[4];
    ldmatrix_run("ldmatrix.x1.trans", 1, 1, addr, r);
    *r0 = r[0];
}
inline void ldmatrix_sync_aligned_m8n8_x1_shared_b16(uint32_t* r0, uint32_t addr) {
    uint32_t r[4];
    ldmatrix_run("ldmatrix.x1", 1, 0, addr, r);
    *r0 = r[0];
}

}  // namespace ptx
}  // namespace emu
