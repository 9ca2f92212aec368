/*
 * check_fp8_prepass_lut.c - host check of the vectorised FP8 pre-pass's byte tables
 * (cuda/gemm_fp8.cu, prepass_*_vec_kernel): for every 16-bit group of 4 codes and every HiF4
 * increment, the byte permute of the 8-entry table OR the spread sign bits must equal
 * fp4rl_e4m3_encode of the scalar kernels' values. Prints "bad 0" and exits 0 when they agree.
 *   gcc -O1 -std=c11 -Icore -Iabi/include tools/check_fp8_prepass_lut.c -lm -o /tmp/lut && /tmp/lut
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "format/formats.h"
#include "format/layout.h"
static uint32_t prmt(uint32_t lo, uint32_t hi, uint32_t sel){ uint64_t v=((uint64_t)hi<<32)|lo; uint32_t r=0; for(int i=0;i<4;i++){int s=(sel>>(4*i))&7; r|=(uint32_t)((v>>(8*s))&0xff)<<(8*i);} return r;}
static uint32_t spread_sign(uint32_t n16){ uint32_t t=n16; t=(t|(t<<8))&0x00FF00FFu; t=(t|(t<<4))&0x0F0F0F0Fu; return (t&0x08080808u)<<4; }
int main(void){
  for(int inc=0;inc<3;inc++){ printf("inc %d:",inc); for(int k=0;k<8;k++) printf(" %02X", fp4rl_e4m3_encode((float)k*(float)(1<<inc),-1.0f)); printf("\n"); }
  printf("mx:"); for(int k=0;k<8;k++) printf(" %02X", fp4rl_e4m3_encode(2.0f*fp4rl_e2m1_decode(k),-1.0f)); printf("\n");
  const uint32_t LO[3]={0x44403800u,0x4C484000u,0x54504800u}, HI[3]={0x4E4C4A48u,0x56545250u,0x5E5C5A58u};
  const uint32_t MLO=0x44403800u, MHI=0x54504C48u;
  long bad=0;
  for(uint32_t n16=0;n16<65536;n16++){
    uint32_t sg=spread_sign(n16);
    for(int inc=0;inc<3;inc++){
      uint32_t o=prmt(LO[inc],HI[inc],n16&0x7777u)|sg;
      for(int e=0;e<4;e++){ uint8_t code=(n16>>(4*e))&15; float m=(float)(code&7u)*(float)(1<<inc); uint8_t ref=fp4rl_e4m3_encode((code&8u)?-m:m,-1.0f); if(((o>>(8*e))&0xff)!=ref) bad++; }
    }
    uint32_t o=prmt(MLO,MHI,n16&0x7777u)|sg;
    for(int e=0;e<4;e++){ uint8_t code=(n16>>(4*e))&15; uint8_t ref=fp4rl_e4m3_encode(2.0f*fp4rl_e2m1_decode(code),-1.0f); if(((o>>(8*e))&0xff)!=ref) bad++; }
  }
  printf("bad %ld\n",bad); return bad!=0;
}
