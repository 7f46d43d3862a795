/*
 * test_layers.c - the room check of `make lint` (scripts/layers.sh and
 * its table scripts/layers.txt) on a copy of the source tree: the tree as
 * it is passes; one include pointing from the lowest room (common/) up
 * into agent/ fails, naming the file, the header and the rooms; a new
 * directory that the table does not place fails, naming it; and the room
 * diagram in docs/ARCHITECTURE.md is refused once it differs from the
 * includes, until --write rewrites it.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

static char tree[] = "/tmp/mr-layers-XXXXXX";

/* The repository's root (where scripts/layers.sh is). */
static const char *repo(void)
{
	static char root[PATH_MAX];
	const char *script = mr_test_repo_file("scripts/layers.sh");
	char *slash;

	snprintf(root, sizeof(root), "%s", script);
	cr_assert((slash = strstr(root, "/scripts/layers.sh")), "no scripts/layers.sh");
	*slash = '\0';
	return root;
}

static void setup(void)
{
	char *out = NULL;

	cr_assert_not_null(mkdtemp(tree));
	cr_assert_eq(mr_test_sh(repo(), &out,
				"cp -r common controller agent runtime cli '%s'/ && "
				"mkdir -p '%s/scripts' '%s/docs' && "
				"cp scripts/layers.sh scripts/layers.txt '%s/scripts/' && "
				"cp docs/ARCHITECTURE.md '%s/docs/'",
				tree, tree, tree, tree, tree),
		     0, "%s", out);
	free(out);
}

static void teardown(void)
{
	char *out = NULL;

	(void)mr_test_sh("/tmp", &out, "rm -rf '%s'", tree);
	free(out);
}

TestSuite(layers, .init = setup, .fini = teardown);

/* The first header of dir (a file name), for an include that resolves. */
static void first_header(const char *dir, char *name, size_t cap)
{
	char path[PATH_MAX];
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "%s/%s", tree, dir);
	cr_assert_not_null(d = opendir(path));
	name[0] = '\0';
	while ((e = readdir(d)))
		if (strlen(e->d_name) > 2 && !strcmp(e->d_name + strlen(e->d_name) - 2, ".h") &&
		    (!name[0] || strcmp(e->d_name, name) < 0))
			snprintf(name, cap, "%s", e->d_name);
	closedir(d);
	cr_assert(name[0], "no header in %s", dir);
}

Test(layers, the_tree_passes_and_an_upward_include_fails_named)
{
	char *out = NULL, hdr[256];

	cr_assert_eq(mr_test_sh(tree, &out, "scripts/layers.sh"), 0, "the tree fails: %s", out);
	free(out);

	first_header("agent", hdr, sizeof(hdr));
	cr_assert_eq(mr_test_sh(tree, NULL, "printf '#include \"%s\"\\n' >>common/err.c", hdr), 0);
	cr_expect_eq(mr_test_sh(tree, &out, "scripts/layers.sh"), 1, "%s", out);
	cr_expect(strstr(out, "common/err.c includes agent/") && strstr(out, hdr) &&
			  strstr(out, "a higher room of common"),
		  "%s", out);
	free(out);
}

Test(layers, a_directory_the_table_does_not_place_fails_named)
{
	char *out = NULL;

	cr_assert_eq(mr_test_sh(tree, NULL,
				"mkdir -p runtime/newroom && "
				"printf '#include \"mr_err.h\"\\n' >runtime/newroom/x.c"),
		     0);
	cr_expect_eq(mr_test_sh(tree, &out, "scripts/layers.sh"), 1, "%s", out);
	cr_expect(strstr(out, "room runtime/newroom") && strstr(out, "not in scripts/layers.txt"),
		  "%s", out);
	free(out);
}

Test(layers, a_stale_diagram_is_refused_until_rewritten)
{
	char *out = NULL;

	cr_assert_eq(mr_test_sh(tree, &out, "scripts/layers.sh --doc docs/ARCHITECTURE.md"), 0,
		     "the committed diagram is stale: %s", out);
	free(out);
	/* a new arrow: cli includes a header of the controller it did not */
	cr_assert_eq(mr_test_sh(tree, NULL,
				"printf '#include \"mr_controller.h\"\\n' >>cli/main.c"),
		     0);
	cr_expect_eq(mr_test_sh(tree, &out, "scripts/layers.sh --doc docs/ARCHITECTURE.md"), 1,
		     "%s", out);
	cr_expect(strstr(out, "the room diagram is stale"), "%s", out);
	free(out);
	cr_assert_eq(mr_test_sh(tree, &out,
				"scripts/layers.sh --doc docs/ARCHITECTURE.md --write && "
				"scripts/layers.sh --doc docs/ARCHITECTURE.md"),
		     0, "%s", out);
	free(out);
}
