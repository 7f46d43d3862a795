/*
 * pview.h - `meshrun local`'s live view on a terminal.
 *
 * The agents' merged output goes through a pipe; every line passes through
 * to stderr except the per-second training progress lines (event=progress),
 * which are folded into one status line that is redrawn in place:
 *
 *   node 0: step=37/100 loss=4.3149 tokens_per_s=2818 ... | node 1: step=...
 *
 * Off a terminal meshrun local does not use this: plain lines go straight
 * to stderr (logs, CI). Non-goals: colours, curses, input.
 */
#ifndef MR_CLI_PVIEW_H
#define MR_CLI_PVIEW_H

#include <stddef.h>

#define MR_PVIEW_NODES 8   /* nodes shown in the status line */
#define MR_PVIEW_FIELD 160 /* bytes kept per node */

struct mr_pview {
	int rfd, wfd;      /* pipe: agents write wfd, the view reads rfd */
	char buf[16384];   /* partial line */
	size_t len;
	char node[MR_PVIEW_NODES][MR_PVIEW_FIELD];
	int shown;         /* a status line is on the screen */
	int width;         /* terminal columns */
};

/* Creates the pipe; wfd is the fd to hand to the agents. 0 or MR_ESYS. */
int mr_pview_open(struct mr_pview *v);
/* Reads what is available (non-blocking) and updates the screen. */
void mr_pview_pump(struct mr_pview *v);
/* Reads the rest, clears the status line, closes the pipe. */
void mr_pview_close(struct mr_pview *v);

#endif
