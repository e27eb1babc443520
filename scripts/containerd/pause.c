/* The sandbox ("pause") process of a CRI pod: holds the pod's namespaces open and does nothing.
 * Built static from source by pause-image.sh, so the test needs no registry. Exits on
 * SIGINT/SIGTERM (StopPodSandbox) and reaps orphans, as Kubernetes' pause does. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(128 + sig); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void) {
	struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	if (sigaction(SIGINT, &q, NULL) || sigaction(SIGTERM, &q, NULL) || sigaction(SIGCHLD, &r, NULL))
		return 1;
	for (;;)
		pause();
}
