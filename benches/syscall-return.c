/*
 * What a function return right after a system call costs on this machine.
 *
 * The same 1400-byte UDP sendto (to 127.0.0.1:9, where nothing listens: the whole IP path and an
 * ICMP reply, no receiver to drain) entered these ways:
 *   inline        the `syscall` instruction in the loop itself (what zerotx's send loop does,
 *                 through rustix);
 *   1 ret         in a function that returns to the loop (what glibc's sendto does);
 *   call+ret,ret  the same, after a call and return of its own once the kernel came back;
 *   32 call+ret   the same with 32 such pairs first;
 *   inline+call   inline, then a call and return made after the system call;
 *   k per ret     k inline sends in a function the loop calls again and again (one return into
 *                 an older frame per k sends: a batch API), for k = 1, 2, 8 and 32;
 *   4 rets        in a function three calls deep, so four returns into older frames follow;
 *   4 rets, fill N  the same, with N return-stack entries filled right after the system call
 *                 (calls never returned from, as zerotx's `sys::refill_return_stack` makes).
 *
 * On the AMD EPYC VMs this project runs on (SRSO "Safe RET", retpolines, RSB filling), any return
 * into a frame that was live before the system call costs 0.5-0.8 us more per call, however many
 * returns matched by calls come before it; returns of calls made after the system call cost
 * nothing. It is the first return that finds a stale entry on the CPU's return stack: with N
 * entries filled after the call, N returns into older frames cost nothing, and the next one pays
 * (4 rets: fill 1 and 2 pay, fill 4 and 32 do not). See benches/compare-raw-results.md.
 *
 *   cc -O2 -o target/syscall-return benches/syscall-return.c && target/syscall-return
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>

static inline long sys6(long n, long a, long b, long c, long d, long e, long f)
{
	long r;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return r;
}

__attribute__((noinline)) void nothing(void) { __asm__ volatile(""); }

#define SEND(fd, buf, len, a) sys6(SYS_sendto, fd, (long)(buf), len, 0, (long)(a), sizeof *(a))

__attribute__((noinline)) long one_ret(long fd, char *buf, long len, struct sockaddr_in *a)
{
	return SEND(fd, buf, len, a);
}

__attribute__((noinline)) long call_ret(long fd, char *buf, long len, struct sockaddr_in *a)
{
	long r = SEND(fd, buf, len, a);
	nothing();
	return r;
}

__attribute__((noinline)) long call_ret32(long fd, char *buf, long len, struct sockaddr_in *a)
{
	long r = SEND(fd, buf, len, a);
	for (int i = 0; i < 32; i++)
		nothing();
	return r;
}

__attribute__((noinline)) long send_k(long fd, char *buf, long len, struct sockaddr_in *a, long k)
{
	long s = 0;
	for (long i = 0; i < k; i++)
		s += SEND(fd, buf, len, a);
	return s;
}

/* Leaves n entries on the return stack that no return will match (past the 128-byte red zone). */
#define FILL(n)                                                                                   \
	__asm__ volatile("sub $128, %%rsp\n\t.rept " #n "\n\tcall 1f\n\tint3\n1:\n\t.endr\n\t"          \
			 "add $(128 + 8 * " #n "), %%rsp" ::: "memory")

/* A frame that calls g and returns what it gave: one more return into an older frame. */
#define LEVEL(f, g)                                                                               \
	__attribute__((noinline)) long f(long fd, char *buf, long len, struct sockaddr_in *a)     \
	{                                                                                         \
		long r = g(fd, buf, len, a);                                                      \
		__asm__ volatile("");                                                             \
		return r;                                                                         \
	}

/* name3 sends three calls deep, running `after` right after the system call. */
#define DEEP(name, after)                                                                         \
	__attribute__((noinline)) long name##0(long fd, char *buf, long len, struct sockaddr_in *a)  \
	{                                                                                         \
		long r = SEND(fd, buf, len, a);                                                   \
		after;                                                                            \
		return r;                                                                         \
	}                                                                                         \
	LEVEL(name##1, name##0)                                                                   \
	LEVEL(name##2, name##1)                                                                   \
	LEVEL(name##3, name##2)

DEEP(plain, )
DEEP(fill1, FILL(1))
DEEP(fill2, FILL(2))
DEEP(fill4, FILL(4))
DEEP(fill32, FILL(32))

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void)
{
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)};
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	static char buf[1400];
	const long n = 300000;
	volatile long s = 0;
	for (int round = 0; round < 3; round++) {
		double t0 = now();
		for (long i = 0; i < n; i++)
			s += SEND(fd, buf, sizeof buf, &a);
		double t1 = now();
		for (long i = 0; i < n; i++)
			s += one_ret(fd, buf, sizeof buf, &a);
		double t2 = now();
		for (long i = 0; i < n; i++)
			s += call_ret(fd, buf, sizeof buf, &a);
		double t3 = now();
		for (long i = 0; i < n; i++)
			s += call_ret32(fd, buf, sizeof buf, &a);
		double t4 = now();
		for (long i = 0; i < n; i++) {
			s += SEND(fd, buf, sizeof buf, &a);
			nothing();
		}
		double t5 = now();
		printf("ns per sendto: inline %.0f, 1 ret %.0f, call+ret,ret %.0f, 32 call+ret,ret %.0f, "
		       "inline+call %.0f",
		       (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, (t3 - t2) / n * 1e9,
		       (t4 - t3) / n * 1e9, (t5 - t4) / n * 1e9);
		static const long ks[] = {1, 2, 8, 32};
		for (unsigned j = 0; j < sizeof ks / sizeof ks[0]; j++) {
			long k = ks[j];
			double t = now();
			for (long i = 0; i < n / k; i++)
				s += send_k(fd, buf, sizeof buf, &a, k);
			printf(", %ld per ret %.0f", k, (now() - t) / (n / k * k) * 1e9);
		}
		long (*deep[])(long, char *, long, struct sockaddr_in *) = {plain3, fill13, fill23, fill43,
									    fill323};
		static const char *names[] = {"", ", fill 1", ", fill 2", ", fill 4", ", fill 32"};
		for (unsigned j = 0; j < sizeof deep / sizeof deep[0]; j++) {
			double t = now();
			for (long i = 0; i < n; i++)
				s += deep[j](fd, buf, sizeof buf, &a);
			printf(", 4 rets%s %.0f", names[j], (now() - t) / n * 1e9);
		}
		printf("\n");
	}
	return 0;
}
