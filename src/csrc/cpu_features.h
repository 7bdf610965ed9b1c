/* CPU feature detection, one function per architecture (cpu_x86.c, cpu_aarch64.c):
 * each sets has[f] = 1 for the gdn_feature values it finds and leaves the rest. */
#ifndef GDNCONV_CPU_FEATURES_H
#define GDNCONV_CPU_FEATURES_H

#include "common.h"

void gdn_detect_x86(unsigned char has[GDN_FEATURE_COUNT]);
void gdn_detect_aarch64(unsigned char has[GDN_FEATURE_COUNT]);

#endif
