/*
 * skiff test pause: the process that holds a pod sandbox's namespaces.
 *
 * It sleeps in pause() forever, reaps every child that is re-parented to it
 * (it is PID 1 of the pod's PID namespace when the pod shares one), and exits
 * with status 0 on SIGTERM or SIGINT so that StopPodSandbox is quick and
 * clean. Built by the harness with `gcc -static -Os` at test time.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "skiff-pause 1"

static void on_stop(int signo)
{
	(void)signo;
	_exit(0);
}

static void on_child(int signo)
{
	int saved = errno;

	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static int install(int signo, void (*handler)(int), int flags)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	return sigaction(signo, &sa, NULL);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		printf("%s\n", VERSION);
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not running as PID 1\n");

	if (install(SIGINT, on_stop, 0) < 0 || install(SIGTERM, on_stop, 0) < 0 ||
	    install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
		perror("pause: sigaction");
		return 1;
	}

	for (;;)
		pause();
	/* not reached */
	return 42;
}
