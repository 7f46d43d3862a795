/*
 * pview.h - `meshrun local`'s view for a person at a terminal.
 *
 * The agents' merged output goes through a pipe. Every line is appended
 * to the log file (where the full structured record lives); the terminal
 * shows what a person follows a run by:
 *
 *   model: gpt2, 393,728 parameters (2 layers, d_model 128, 4 heads) ...
 *   step   10/30  loss 5.1848  grad_norm 1.988  lr 1.00e-03  19504 tok/s ...
 *   step   15/30  loss 4.8944  val 4.8026  ...
 *   done: succeeded, 30/30 steps in 2.0 s, 0 restarts
 *     loss 4.6160  val_loss 4.4811  best val_loss 4.4811 (step 30)  ...
 *
 * from rank 0's worker_ready, step and job_summary events; warnings,
 * errors, restarts and resumes as they are; `meshrun local`'s own lines;
 * and a status line redrawn in place from the agents' per-second progress
 * events (node 0's step and ETA, or the first node that reports a stall).
 * Every other line is in the log file only.
 *
 * Off a terminal (and with --log-format json) meshrun local does not use
 * this: the structured lines go straight to stderr (logs, CI, pods).
 * Non-goals: colours, curses, input.
 */
#ifndef MR_CLI_PVIEW_H
#define MR_CLI_PVIEW_H

#include <stddef.h>
#include <stdio.h>

#include "mr_err.h"

#define MR_PVIEW_STATUS 160 /* bytes of the status line */

struct mr_pview {
	int rfd, wfd;      /* pipe: agents write wfd, the view reads rfd */
	FILE *log;         /* every line; NULL: none */
	char buf[16384];   /* partial line */
	size_t len;
	char status[MR_PVIEW_STATUS];
	int status_node;   /* the node the status line is from (-1: none) */
	int shown;         /* a status line is on the screen */
	int width;         /* terminal columns */
};

/* Creates the pipe and opens log_path (appended; NULL: no log file); wfd
 * is the fd to hand to the agents. 0, or MR_ESYS with eb set. */
int mr_pview_open(struct mr_pview *v, const char *log_path, struct mr_errbuf *eb);
/* Reads what is available (non-blocking) and updates the screen. */
void mr_pview_pump(struct mr_pview *v);
/* Reads the rest, clears the status line, closes the pipe and the log. */
void mr_pview_close(struct mr_pview *v);

#endif
