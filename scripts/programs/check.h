/* What the stack matrix's C programs share: checks that fail the run
 * with where and why (CHECK also counts itself passed, for the program's
 * last line), and an IPv4 socket address from text. */
#ifndef SOFTRNIC_CHECK_H
#define SOFTRNIC_CHECK_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks;

#define REQUIRE(cond, ...)                                                 \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                      \
			fprintf(stderr, " (errno %s)\n", strerror(errno)); \
			exit(1);                                           \
		}                                                          \
	} while (0)

#define CHECK(cond, ...)                    \
	do {                                \
		REQUIRE(cond, __VA_ARGS__); \
		checks++;                   \
	} while (0)

static inline struct sockaddr_in address(const char *ip, int port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };

	if (inet_pton(AF_INET, ip, &sin.sin_addr) != 1) {
		fprintf(stderr, "not an IPv4 address: %s\n", ip);
		exit(2);
	}
	return sin;
}

#endif
