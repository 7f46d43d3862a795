/*
 * mr_cli.h - subcommands of the `meshrun` command-line tool.
 *
 * Each subcommand lives in its own file (cli/<name>.c) and has the shape
 * of a small main(): it receives the arguments after its own name
 * (argv[0] is the subcommand name) and returns the process exit code
 * (0 success, 1 failure, 2 usage error).
 */
#ifndef MR_CLI_H
#define MR_CLI_H

int mr_cli_status(int argc, char **argv);
int mr_cli_local(int argc, char **argv);
int mr_cli_mesh(int argc, char **argv);
int mr_cli_plan(int argc, char **argv);
int mr_cli_data(int argc, char **argv);
int mr_cli_ckpt(int argc, char **argv);
int mr_cli_plot(int argc, char **argv);
int mr_cli_generate(int argc, char **argv);

#endif
