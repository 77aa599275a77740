/*
 * bcryptprimitives.dll for Wine 8, which has none: Rust's std (1.78 and
 * later) imports ProcessPrng from it for its random numbers (HashMap seeds
 * and the like), and without it every Rust program fails to start
 * (STATUS_DLL_NOT_FOUND, c0000135). ProcessPrng is filled in here by
 * RtlGenRandom (advapi32's SystemFunction036), which Wine has.
 *
 * Built by .ci/wine/setup.sh with x86_64-w64-mingw32-gcc and put in the
 * Wine prefix's system32. CI only: nothing here ships.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, n))
            return FALSE;
        data += n;
        len -= n;
    }
    /* Like Windows' own, this never fails. */
    return TRUE;
}

BOOL WINAPI DllMain(HINSTANCE instance, DWORD reason, LPVOID reserved)
{
    (void)instance;
    (void)reason;
    (void)reserved;
    return TRUE;
}
