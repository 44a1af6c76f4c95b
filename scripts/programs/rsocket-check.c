/* rsockets end to end, through <rdma/rsocket.h> as rdma-core declares it:
 * a stream's bytes arrive whole and in order, a reader that stops holds
 * its writer (a non-blocking rsend says EAGAIN long before the bytes run
 * out, nothing is lost, and riomap still waits for room), MSG_PEEK and MSG_WAITALL, rpoll and rselect over
 * an rsocket and a pipe together, riomap/riowrite into the peer's memory,
 * one thread sending while another receives on the same rsocket (the
 * server echoes), the end of the stream after rshutdown, the addresses, and what is
 * refused (datagram rsockets, other families, a port nobody listens on).
 * With -n, the device's own counters show no RNR NAK, retransmission or
 * timeout: the rsocket's credits kept every SEND within the peer's
 * posted receives.
 *
 *   rsocket-check -s ADDR PORT [-n]      # the server
 *   rsocket-check -c ADDR PORT [-n]      # the client: prints "N checks passed"
 *
 * Built and run by scripts/stack-matrix.py over softrnic's librdmacm. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rsocket.h>

#include "check.h"

#define STREAM_BYTES (8 << 20)
#define MAP_BYTES (64 << 10)
#define ECHO_BYTES (4 << 20)

static uint8_t pattern(size_t at)
{
	return (uint8_t)(at * 7 + (at >> 13));
}

/* The first byte of BUF that is not the pattern from START, or LEN. */
static size_t mismatch(const uint8_t *buf, size_t len, size_t start)
{
	size_t i = 0;

	while (i < len && buf[i] == pattern(start + i))
		i++;
	return i;
}

static void send_all(int s, const void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = rsend(s, (const char *)buf + done, len - done, 0);
		REQUIRE(n > 0, "rsend");
		done += n;
	}
}

static void recv_all(int s, void *buf, size_t len)
{
	ssize_t n = rrecv(s, buf, len, MSG_WAITALL);

	CHECK(n == (ssize_t)len, "rrecv MSG_WAITALL got %zd of %zu", n, len);
}

static void line(int s, const char *word)
{
	char buf[16] = {0};

	strncpy(buf, word, sizeof buf - 1);
	send_all(s, buf, sizeof buf);
}

static void expect_line(int s, const char *word)
{
	char buf[16];

	recv_all(s, buf, sizeof buf);
	CHECK(!strcmp(buf, word), "wanted \"%s\", got \"%.16s\"", word, buf);
}

/* The device's counter NAME, from the port's hw_counters. */
static long counter(const char *name)
{
	char path[256];
	long value = -1;
	FILE *f;

	snprintf(path, sizeof path, "/sys/class/infiniband/softrnic0/ports/1/hw_counters/%s", name);
	f = fopen(path, "r");
	CHECK(f, "open %s", path);
	CHECK(fscanf(f, "%ld", &value) == 1, "read %s", path);
	fclose(f);
	return value;
}

static void no_retries(void)
{
	const char *names[] = { "rnr_naks_sent", "rnr_naks_received", "retransmitted_packets", "timeouts" };

	for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
		long v = counter(names[i]);
		CHECK(v == 0, "%s is %ld", names[i], v);
	}
}

static void refusals(const char *ip)
{
	struct sockaddr_in nobody = address(ip, 9);
	int s;

	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == EPROTONOSUPPORT, "a datagram rsocket is refused");
	errno = 0;
	CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == EAFNOSUPPORT, "an AF_UNIX rsocket is refused");
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "rsocket");
	errno = 0;
	CHECK(rconnect(s, (struct sockaddr *)&nobody, sizeof nobody) == -1 && errno == ECONNREFUSED,
	      "a port nobody listens on refuses");
	errno = 0;
	CHECK(rsend(s, "x", 1, 0) == -1 && errno == ENOTCONN, "rsend before a connection");
	int value = 0;
	socklen_t len = sizeof value;
	errno = 0;
	CHECK(rgetsockopt(s, IPPROTO_TCP, TCP_INFO, &value, &len) == -1 && errno == ENOPROTOOPT,
	      "an unknown option");
	CHECK(rclose(s) == 0, "rclose");
	errno = 0;
	CHECK(rclose(s) == -1 && errno == EBADF, "rclose twice");
}

static void server(const char *ip, int port, int counters)
{
	struct sockaddr_in sin = address(ip, port), peer;
	socklen_t len = sizeof peer;
	uint8_t *buf = malloc(STREAM_BYTES), peeked[16];
	uint8_t *map = calloc(1, MAP_BYTES);
	int l, s, one = 1;

	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket");
	CHECK(!rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), "SO_REUSEADDR");
	CHECK(!rsetsockopt(l, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof one), "RDMA_IOMAPSIZE");
	CHECK(!rbind(l, (struct sockaddr *)&sin, sizeof sin), "rbind");
	CHECK(!rlisten(l, 4), "rlisten");
	s = raccept(l, (struct sockaddr *)&peer, &len);
	CHECK(s >= 0, "raccept");
	CHECK(len == sizeof peer && peer.sin_family == AF_INET, "raccept gives the peer's address");

	/* The client sends until its buffers fill; nothing is read yet. */
	usleep(300 * 1000);
	CHECK(rrecv(s, peeked, sizeof peeked, MSG_PEEK) == sizeof peeked, "MSG_PEEK");
	recv_all(s, buf, STREAM_BYTES);
	CHECK(!memcmp(peeked, buf, sizeof peeked), "MSG_PEEK saw what the read took");
	size_t bad = mismatch(buf, STREAM_BYTES, 0);
	CHECK(bad == STREAM_BYTES, "byte %zu of the stream is %u, not %u", bad, buf[bad], pattern(bad));
	line(s, "got it");

	/* riomap: the client writes into this buffer, then says so. */
	CHECK(riomap(s, map, MAP_BYTES, PROT_WRITE, 0, 0) == 0, "riomap at offset 0");
	line(s, "mapped");
	expect_line(s, "written");
	bad = mismatch(map, MAP_BYTES, 1);
	CHECK(bad == MAP_BYTES, "mapped byte %zu is %u, not %u", bad, map[bad], pattern(bad + 1));
	CHECK(!riounmap(s, map, MAP_BYTES), "riounmap");

	/* Echo what the client's writer thread sends, as it comes. */
	for (size_t echoed = 0; echoed < ECHO_BYTES;) {
		ssize_t n = rrecv(s, buf, ECHO_BYTES - echoed < 65536 ? ECHO_BYTES - echoed : 65536, 0);
		REQUIRE(n > 0, "rrecv to echo");
		send_all(s, buf, n);
		echoed += n;
	}

	/* A byte for the client's rpoll and rselect. */
	expect_line(s, "poll me");
	send_all(s, "!", 1);

	/* The end of the stream. */
	CHECK(rrecv(s, buf, 16, 0) == 0, "the end of the stream after rshutdown(SHUT_WR)");
	line(s, "bye");
	if (counters)
		no_retries();
	CHECK(!rclose(s), "rclose");
	CHECK(!rclose(l), "rclose the listener");
	printf("server: %d checks passed\n", checks);
}

struct writer {
	int s;
	const uint8_t *buf;
};

static void *write_echo(void *arg)
{
	struct writer *w = arg;

	for (size_t done = 0; done < ECHO_BYTES; done += 4096)
		send_all(w->s, w->buf + done, 4096);
	return NULL;
}

static void client(const char *ip, int port, int counters)
{
	struct sockaddr_in sin = address(ip, port), name;
	socklen_t len = sizeof name;
	uint8_t *buf = malloc(STREAM_BYTES), small[16];
	int s, one = 1, pipefd[2];
	size_t sent = 0;
	ssize_t n;

	for (size_t i = 0; i < STREAM_BYTES; i++)
		buf[i] = pattern(i);
	refusals(ip);

	s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "rsocket");
	CHECK(!rsetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof one), "RDMA_IOMAPSIZE");
	CHECK(!rconnect(s, (struct sockaddr *)&sin, sizeof sin), "rconnect");
	CHECK(!rgetpeername(s, (struct sockaddr *)&name, &len), "rgetpeername");
	CHECK(name.sin_port == sin.sin_port && name.sin_addr.s_addr == sin.sin_addr.s_addr, "the peer's address");
	len = sizeof name;
	CHECK(!rgetsockname(s, (struct sockaddr *)&name, &len) && name.sin_family == AF_INET, "rgetsockname");

	/* Non-blocking: nothing to read, and a writer that fills the
	 * reader's buffers (the server does not read for 300 ms). */
	CHECK(!rfcntl(s, F_SETFL, O_NONBLOCK), "O_NONBLOCK");
	CHECK(rfcntl(s, F_GETFL) & O_NONBLOCK, "F_GETFL says O_NONBLOCK");
	errno = 0;
	CHECK(rrecv(s, small, sizeof small, 0) == -1 && errno == EAGAIN, "nothing to read yet");
	for (;;) {
		n = rsend(s, buf + sent, STREAM_BYTES - sent, 0);
		if (n < 0)
			break;
		sent += n;
	}
	CHECK(errno == EAGAIN, "a full stream says EAGAIN");
	CHECK(sent > 0 && sent < STREAM_BYTES / 2, "the reader's buffers held the writer at %zu bytes", sent);
	/* riomap and riounmap finish what they start, room or not: they wait
	 * for the reader even on a non-blocking socket. */
	uint8_t *spare = calloc(1, 4096);
	off_t at = riomap(s, spare, 4096, PROT_WRITE, 0, -1);
	CHECK(at == 0, "riomap on a full non-blocking stream (got %lld)", (long long)at);
	CHECK(!riounmap(s, spare, 4096), "riounmap on a full non-blocking stream");
	CHECK(!rfcntl(s, F_SETFL, 0), "blocking again");
	send_all(s, buf + sent, STREAM_BYTES - sent);
	expect_line(s, "got it");

	expect_line(s, "mapped");
	for (size_t done = 0; done < MAP_BYTES;) {
		size_t w = riowrite(s, buf + 1 + done, MAP_BYTES - done, done, 0);
		REQUIRE(w != (size_t)-1 && w > 0, "riowrite");
		done += w;
	}
	line(s, "written");

	/* One thread writes while this one reads the echo. */
	struct writer w = { .s = s, .buf = buf };
	pthread_t writer;
	uint8_t *echo = malloc(ECHO_BYTES);
	CHECK(!pthread_create(&writer, NULL, write_echo, &w), "pthread_create");
	recv_all(s, echo, ECHO_BYTES);
	CHECK(!pthread_join(writer, NULL), "pthread_join");
	size_t bad = mismatch(echo, ECHO_BYTES, 0);
	CHECK(bad == ECHO_BYTES, "echoed byte %zu is %u, not %u", bad, echo[bad], pattern(bad));

	/* rpoll over a pipe and the rsocket; then rselect. */
	CHECK(!pipe(pipefd), "pipe");
	struct pollfd fds[2] = { { .fd = pipefd[0], .events = POLLIN }, { .fd = s, .events = POLLIN } };
	CHECK(rpoll(fds, 2, 50) == 0, "rpoll: nothing ready for 50 ms");
	CHECK(write(pipefd[1], "x", 1) == 1, "write the pipe");
	CHECK(rpoll(fds, 2, 1000) == 1 && fds[0].revents == POLLIN && !fds[1].revents, "rpoll: the pipe");
	line(s, "poll me");
	fds[0].events = 0;
	CHECK(rpoll(fds, 2, 5000) == 1 && fds[1].revents & POLLIN, "rpoll: the rsocket");
	fd_set readable;
	FD_ZERO(&readable);
	FD_SET(s, &readable);
	struct timeval tv = { .tv_sec = 5 };
	CHECK(rselect(s + 1, &readable, NULL, NULL, &tv) == 1 && FD_ISSET(s, &readable), "rselect");
	CHECK(rrecv(s, small, 1, 0) == 1 && small[0] == '!', "the byte");

	CHECK(!rshutdown(s, SHUT_WR), "rshutdown SHUT_WR");
	errno = 0;
	CHECK(rsend(s, "x", 1, 0) == -1 && errno == EPIPE, "no rsend after SHUT_WR");
	expect_line(s, "bye");
	CHECK(rrecv(s, small, sizeof small, 0) == 0, "the server's end of the stream");
	if (counters)
		no_retries();
	CHECK(!rclose(s), "rclose");
	printf("%d checks passed\n", checks);
}

int main(int argc, char **argv)
{
	int counters = argc > 4 && !strcmp(argv[4], "-n");

	if (argc < 4 || (strcmp(argv[1], "-s") && strcmp(argv[1], "-c"))) {
		fprintf(stderr, "usage: %s -s|-c ADDR PORT [-n]\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "-s"))
		server(argv[2], atoi(argv[3]), counters);
	else
		client(argv[2], atoi(argv[3]), counters);
	return 0;
}
