// The Linux system calls the agent makes through syscall(2) where glibc has no wrapper, by name:
// <sys/syscall.h>, plus the names that glibc < 2.34 and kernel headers < 5.11 lack (close_range: Linux 5.9,
// CLOSE_RANGE_CLOEXEC: 5.11). The release is built against glibc 2.31 and Linux 5.10's headers
// (scripts/release.sh); the numbers are the kernel's ABI, the same everywhere. On a kernel without the call,
// syscall returns -1 with ENOSYS (each caller says what it does then).
#pragma once

#include <sys/syscall.h>  // SYS_pidfd_open, SYS_pidfd_send_signal, SYS_clone3 (glibc >= 2.31), __NR_*

#ifndef SYS_close_range
#define SYS_close_range __NR_close_range
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
