/*
 * The core counts before nrt_init, as libfabric asks for them, then nrt_init: prints
 * "TOTAL <status> <count>", "VISIBLE <status> <count>" and "INIT <status>". The test runs it
 * under different environments. Usage: counts
 */
#include <stdint.h>

#include "nrt/nrt.h"
#include "common.h"

int main(void) {
    uint32_t total = 0, visible = 0;
    NRT_STATUS t = nrt_get_total_vnc_count(&total);
    NRT_STATUS v = nrt_get_visible_vnc_count(&visible);
    NRT_STATUS i;
    printf("TOTAL %d %u\n", (int)t, total);
    printf("VISIBLE %d %u\n", (int)v, visible);
    i = nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "");
    printf("INIT %d\n", (int)i);
    if (i == NRT_SUCCESS) {
        nrt_close();
    }
    return 0;
}
