// ThreadSanitizer annotations for Debian's uninstrumented Abseil
// synchronization library, linked only into the TSan build
// (tests/sanitizers.sh).
//
// Why: libabsl_synchronization.so from Debian is not built with
// -fsanitize=thread, so TSan never sees absl::Mutex, CondVar, Notification
// or BlockingCounter create happens-before edges (they use uninstrumented
// atomics and futexes). Every ABSL_GUARDED_BY member would then be reported
// as racing. Rather than suppress reports in our own code, the link wraps
// the entry points our code calls (-Wl,--wrap=<mangled name>) and tells TSan
// what they mean: taking a lock or being woken is an acquire of the object,
// releasing a lock or signalling is a release. Calls made from inside the
// library itself (already uninstrumented) are unaffected.
//
// The mangled names are those of Abseil 20220623 as Debian builds it
// (inline namespace absl::debian3); tests/sanitizers.sh checks that the
// library exports them and builds without the shim (warning) if not.
#include <cstdint>

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();
}

// Argument lists are passed through as opaque words: every wrapped function
// takes `this` plus at most two arguments (a Condition reference or pointer,
// a Mutex pointer, a Duration/Time passed in two registers or by value).
// Duration and Time are 16-byte trivially-copyable types passed in two
// registers on x86-64, which the two extra words cover.
using W = uintptr_t;

// Inside the library absl::Mutex evaluates Condition callbacks (our
// instrumented lambdas) with its lock held, in whichever thread is locking,
// unlocking or waiting; TSan cannot see that lock, so accesses made during a
// wrapped call are ignored (__tsan_ignore_thread_*: this thread only, memory
// accesses only). They happen under the mutex by Abseil's contract.
#define PSERVER_TSAN_CALL_REAL(mangled, ...) \
  __tsan_ignore_thread_begin();              \
  W r = __real_##mangled(__VA_ARGS__);       \
  __tsan_ignore_thread_end();

#define PSERVER_TSAN_LOCK(mangled)                               \
  extern "C" W __real_##mangled(void*, W, W, W);                \
  extern "C" W __wrap_##mangled(void* self, W a, W b, W c) {    \
    PSERVER_TSAN_CALL_REAL(mangled, self, a, b, c)              \
    __tsan_acquire(self);                                       \
    return r;                                                   \
  }

#define PSERVER_TSAN_UNLOCK(mangled)                             \
  extern "C" W __real_##mangled(void*, W, W, W);                \
  extern "C" W __wrap_##mangled(void* self, W a, W b, W c) {    \
    __tsan_release(self);                                       \
    PSERVER_TSAN_CALL_REAL(mangled, self, a, b, c)              \
    return r;                                                   \
  }

// Await-style: releases the mutex while waiting, holds it again on return.
#define PSERVER_TSAN_AWAIT(mangled)                              \
  extern "C" W __real_##mangled(void*, W, W, W);                \
  extern "C" W __wrap_##mangled(void* self, W a, W b, W c) {    \
    __tsan_release(self);                                       \
    PSERVER_TSAN_CALL_REAL(mangled, self, a, b, c)              \
    __tsan_acquire(self);                                       \
    return r;                                                   \
  }

// CondVar::Wait*(Mutex* mu, ...): the mutex (first argument) is released
// while waiting; the condvar carries the signal.
#define PSERVER_TSAN_CV_WAIT(mangled)                            \
  extern "C" W __real_##mangled(void*, W, W, W);                \
  extern "C" W __wrap_##mangled(void* self, W mu, W b, W c) {   \
    __tsan_release(reinterpret_cast<void*>(mu));                \
    PSERVER_TSAN_CALL_REAL(mangled, self, mu, b, c)             \
    __tsan_acquire(self);                                       \
    __tsan_acquire(reinterpret_cast<void*>(mu));                \
    return r;                                                   \
  }

// absl::Mutex
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex4LockEv)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex10ReaderLockEv)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex7TryLockEv)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex13ReaderTryLockEv)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)
PSERVER_TSAN_LOCK(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)
PSERVER_TSAN_UNLOCK(_ZN4absl7debian35Mutex6UnlockEv)
PSERVER_TSAN_UNLOCK(_ZN4absl7debian35Mutex12ReaderUnlockEv)
PSERVER_TSAN_AWAIT(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)
PSERVER_TSAN_AWAIT(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)
PSERVER_TSAN_AWAIT(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)
// absl::CondVar
PSERVER_TSAN_CV_WAIT(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)
PSERVER_TSAN_CV_WAIT(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)
PSERVER_TSAN_CV_WAIT(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)
PSERVER_TSAN_UNLOCK(_ZN4absl7debian37CondVar6SignalEv)
PSERVER_TSAN_UNLOCK(_ZN4absl7debian37CondVar9SignalAllEv)
// absl::Notification (HasBeenNotified() is inline and reads an atomic the
// library writes: waiters must use WaitForNotification*).
PSERVER_TSAN_UNLOCK(_ZN4absl7debian312Notification6NotifyEv)
PSERVER_TSAN_LOCK(_ZNK4absl7debian312Notification19WaitForNotificationEv)
PSERVER_TSAN_LOCK(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)
PSERVER_TSAN_LOCK(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)
// absl::BlockingCounter
PSERVER_TSAN_UNLOCK(_ZN4absl7debian315BlockingCounter14DecrementCountEv)
PSERVER_TSAN_LOCK(_ZN4absl7debian315BlockingCounter4WaitEv)
