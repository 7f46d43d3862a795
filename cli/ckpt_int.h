/*
 * ckpt_int.h - the pieces of `meshrun ckpt` shared by its files: ckpt.c
 * (options, export, import) and ckpt_inspect.c (inspect).
 */
#ifndef MR_CLI_CKPT_INT_H
#define MR_CLI_CKPT_INT_H

/* Exit codes (mr_cli.h): 0 ok, 1 a checkpoint or file is bad or a step
 * failed, 2 a usage error. */
enum { CKPT_EXIT_OK = 0, CKPT_EXIT_FAIL = 1, CKPT_EXIT_USAGE = 2 };

/* The step directories DIR stands for, newest first: itself when it holds
 * a manifest.json, else the published steps of a checkpoint directory.
 * *dirs malloc'd (mr_ckpt_list_free); *is_step: DIR is one step. Returns
 * an exit code, the message printed. */
int mr__ckpt_resolve(const char *cmd, const char *dir, char ***dirs, int *n, int *is_step);

/* `meshrun ckpt inspect DIR [--json]`; the exit code. */
int mr__ckpt_inspect(const char *dir, int json);

#endif
