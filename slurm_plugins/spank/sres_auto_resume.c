/*
 * srun --auto-resume[=N]: hand the step to the sres supervisor (sres srun) with N retries.
 *
 * Loaded by srun from plugstack.conf:
 *     optional /usr/local/lib/sres/sres_auto_resume.so sres=/usr/local/bin/sres
 * In srun's local context, after option processing, the plugin replaces srun with
 * `sres srun <srun's arguments, as given>`: sres starts each rank as an srun step
 * of its own, watches it, and on a fault drains the bad node, moves the node's ranks to a
 * spare node or a node the job grows into, and requeues the job as the last resort. The
 * environment variable SRES_AUTO_RESUME_ACTIVE marks the processes sres starts, so the
 * plugin never replaces those srun commands again.
 *
 * Build: sres hooks build-spank   (gcc -shared -fPIC against the cluster's own spank.h)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(sres_auto_resume, 1);

#define MARKER "SRES_AUTO_RESUME_ACTIVE"

static int retries = -1; /* -1: option not given */
static char sres[4096] = "sres";

static int parse_retries(int val, const char *optarg, int remote)
{
	char *end = NULL;
	long n;

	(void) val;
	(void) remote;
	if (optarg == NULL || *optarg == '\0') {
		retries = 1;
		return 0;
	}
	errno = 0;
	n = strtol(optarg, &end, 10);
	if (errno || *end != '\0' || n < 0 || n > 1000000) {
		slurm_error("--auto-resume=%s: expected a number of retries (0 or more)", optarg);
		return -1;
	}
	retries = (int) n;
	return 0;
}

static struct spank_option auto_resume_option = {
	"auto-resume", "N",
	"Recover from up to N faults without ending the step (sres): drain a bad node, move its ranks "
	"to a spare or grown node, restore state from peers, requeue as a last resort. N defaults to 1.",
	2, 0, parse_retries
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "sres=", 5) == 0 && strlen(av[i] + 5) < sizeof(sres)) {
			strcpy(sres, av[i] + 5);
		} else {
			slurm_error("sres_auto_resume: unknown plugin argument '%s' (expected sres=/path/to/sres)", av[i]);
			return -1;
		}
	}
	if (spank_context() != S_CTX_LOCAL && spank_context() != S_CTX_REMOTE)
		return 0; /* sbatch and salloc do not get the option */
	return spank_option_register(sp, &auto_resume_option) == ESPANK_SUCCESS ? 0 : -1;
}

/* srun's own command line, as the kernel holds it: NUL-separated words, however long (the
 * buffer grows: a long command line must run whole or not at all, never cut short). */
static char **read_cmdline(int *count)
{
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap), *grown, **words;
	ssize_t n;
	int fd, k;
	size_t i;

	fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || buf == NULL)
		goto fail;
	while ((n = read(fd, buf + len, cap - 1 - len)) > 0) {
		len += (size_t) n;
		if (len == cap - 1) {
			grown = realloc(buf, cap * 2);
			if (grown == NULL)
				goto fail;
			buf = grown;
			cap *= 2;
		}
	}
	if (n < 0)
		goto fail;
	close(fd);
	buf[len] = '\0';
	for (i = 0, k = 0; i < len; i++)
		if (buf[i] == '\0')
			k++;
	words = calloc(k + 1, sizeof(char *));
	if (words == NULL)
		return NULL;
	for (i = 0, k = 0; i < len; i += strlen(buf + i) + 1)
		words[k++] = buf + i;
	*count = k;
	return words;
fail:
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char **words, **argv;
	int count = 0, i, n = 0;

	(void) sp;
	(void) ac;
	(void) av;
	if (spank_context() != S_CTX_LOCAL || retries < 0 || getenv(MARKER) != NULL)
		return 0;
	words = read_cmdline(&count);
	if (words == NULL || count < 1) {
		slurm_error("sres_auto_resume: cannot read srun's command line: %s", strerror(errno));
		return -1;
	}
	argv = calloc(count + 2, sizeof(char *));
	if (argv == NULL)
		return -1;
	/* srun's words go over unchanged: sres srun parses srun's options (its --auto-resume among
	 * them) and stops at the program, so the program's own arguments, an --auto-resume of its
	 * own included, reach it as written. */
	argv[n++] = sres;
	argv[n++] = "srun";
	for (i = 1; i < count; i++)
		argv[n++] = words[i];
	argv[n] = NULL;
	setenv(MARKER, "1", 1);
	if (strchr(sres, '/'))
		execv(sres, argv);
	else
		execvp(sres, argv);
	slurm_error("sres_auto_resume: cannot run %s: %s (set sres=/path/to/sres in plugstack.conf)", sres,
		    strerror(errno));
	return -1;
}
