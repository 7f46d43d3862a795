/*
 * plot.c - `meshrun plot LOSS_LOG [-o OUT.svg]`: a run's loss log drawn as
 * an SVG a browser opens.
 *
 * The input is a gpt worker's loss_log (mr_gpt_worker.h): the header
 * MR_LOSS_LOG_HEADER, then one line per step, "step loss aux_loss
 * grad_norm lr val_loss", steps increasing, val_loss "nan" where no
 * validation ran. Anything else is refused naming the file, the line and
 * the reason (exit 1); nothing is written then.
 *
 * The picture: axes with ticks at round numbers and their labels, the
 * training loss as one polyline (a point per step, id "train"), the
 * validation losses as points (circles in the group id "val"), and a
 * legend. The SVG is written by hand (no library): text is escaped, so
 * the file is well-formed XML.
 *
 * Non-goals: other columns (lr, grad_norm), several runs in one picture,
 * thinning very long logs (a point per step; at most PLOT_MAX_ROWS).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_cli.h"
#include "mr_config.h"
#include "mr_gpt_worker.h"

#define PLOT_MAX_LINE 4096         /* bytes of one line of the log */
#define PLOT_MAX_ROWS (1L << 22)   /* steps drawn */
#define PLOT_W 800.0
#define PLOT_H 480.0
#define PLOT_L 72.0 /* margins: room for the tick labels */
#define PLOT_R 24.0
#define PLOT_T 40.0
#define PLOT_B 56.0

struct plot_opts {
	char out[1024];
	char title[256];
};

/* no environment variables: a plot's output is the command line's */
static const struct mr_config_opt plot_table[] = {
	{ .name = "out", .type = MR_CONFIG_T_STRING, MR__CFG_FIELD(struct plot_opts, out),
	  .def = "", .env = "",
	  .help = "The SVG to write (also -o; default: LOSS_LOG with its extension replaced by "
		  ".svg)." },
	{ .name = "title", .type = MR_CONFIG_T_STRING, MR__CFG_FIELD(struct plot_opts, title),
	  .def = "", .env = "", .help = "Title above the plot (default: the log's file name)." },
};

/* The log's rows: step, training loss, validation loss (NaN: none). */
struct plot_data {
	double *step, *loss, *val;
	long n, cap;
	long nval; /* rows with a validation loss */
};

static void data_free(struct plot_data *d)
{
	free(d->step);
	free(d->loss);
	free(d->val);
}

static int data_push(struct plot_data *d, double step, double loss, double val)
{
	if (d->n == d->cap) {
		long nc = d->cap ? d->cap * 2 : 1024;
		double *a = realloc(d->step, sizeof(double) * nc);
		double *b = a ? realloc(d->loss, sizeof(double) * nc) : NULL;
		double *c = b ? realloc(d->val, sizeof(double) * nc) : NULL;

		if (a)
			d->step = a;
		if (b)
			d->loss = b;
		if (!c)
			return -1;
		d->val = c;
		d->cap = nc;
	}
	d->step[d->n] = step;
	d->loss[d->n] = loss;
	d->val[d->n] = val;
	d->n++;
	d->nval += !isnan(val);
	return 0;
}

/* Splits line into at most max whitespace-separated fields (in place);
 * their count, max + 1 when there are more. */
static int split(char *line, char **f, int max)
{
	int n = 0;

	for (char *p = line;;) {
		p += strspn(p, " \t\r\n");
		if (!*p)
			return n;
		if (n == max)
			return max + 1;
		f[n++] = p;
		p += strcspn(p, " \t\r\n");
		if (*p)
			*p++ = '\0';
	}
}

/* A whole field as a number (nan and inf included); 0, or -1. */
static int number(const char *s, double *v)
{
	char *end;

	errno = 0;
	*v = strtod(s, &end);
	return end != s && !*end && errno != ERANGE ? 0 : -1;
}

/* One step's line (lineno for messages) into d; a message into why. */
static int parse_row(char *line, struct plot_data *d, char *why, size_t cap)
{
	static const char *const names[] = { "step", "loss", "aux_loss", "grad_norm", "lr",
					     "val_loss" };
	char *f[6];
	double v[6];
	int n = split(line, f, 6);

	if (n != 6) {
		snprintf(why, cap, "%s%d columns, want 6 (%s)", n > 6 ? "more than " : "",
			 n > 6 ? 6 : n, MR_LOSS_LOG_HEADER);
		return -1;
	}
	for (int i = 0; i < 6; i++)
		if (number(f[i], &v[i]) < 0) {
			snprintf(why, cap, "%s '%.40s' is not a number", names[i], f[i]);
			return -1;
		}
	if (v[0] < 1 || v[0] != floor(v[0]) || v[0] > 1e15) {
		snprintf(why, cap, "step '%.40s' is not a step number", f[0]);
		return -1;
	}
	if (d->n > 0 && v[0] <= d->step[d->n - 1]) {
		snprintf(why, cap, "step %.0f does not follow step %.0f", v[0], d->step[d->n - 1]);
		return -1;
	}
	if (!isfinite(v[1])) {
		snprintf(why, cap, "loss '%.40s' is not finite", f[1]);
		return -1;
	}
	if (isinf(v[5])) {
		snprintf(why, cap, "val_loss '%.40s' is not finite (nan: no validation)", f[5]);
		return -1;
	}
	if (d->n >= PLOT_MAX_ROWS) {
		snprintf(why, cap, "more than %ld steps", PLOT_MAX_ROWS);
		return -1;
	}
	if (data_push(d, v[0], v[1], v[5]) < 0) {
		snprintf(why, cap, "out of memory");
		return -1;
	}
	return 0;
}

/* Reads path into d; on failure prints "file line N: reason". */
static int read_log(const char *path, struct plot_data *d)
{
	char line[PLOT_MAX_LINE + 2], why[256] = "", *f[7];
	FILE *in = fopen(path, "r");
	long lineno = 0;
	int rc = 0;

	if (!in) {
		fprintf(stderr, "meshrun plot: unable to open '%s': %s\n", path, strerror(errno));
		return -1;
	}
	while (rc == 0 && fgets(line, sizeof(line), in)) {
		lineno++;
		if (strlen(line) > PLOT_MAX_LINE) {
			snprintf(why, sizeof(why), "longer than %d bytes", PLOT_MAX_LINE);
			rc = -1;
		} else if (lineno == 1) {
			/* the header, by its words (a trailing \r or space is fine) */
			char want[] = MR_LOSS_LOG_HEADER, *w[7];
			int n = split(line, f, 6), m = split(want, w, 6);
			for (int i = 0; i < m && n == m; i++)
				n = strcmp(f[i], w[i]) ? -1 : n;
			if (n != m) {
				snprintf(why, sizeof(why), "not the header \"%s\" (a loss_log of this "
					 "version starts with it)", MR_LOSS_LOG_HEADER);
				rc = -1;
			}
		} else {
			rc = parse_row(line, d, why, sizeof(why));
		}
	}
	if (rc == 0 && ferror(in)) {
		fprintf(stderr, "meshrun plot: unable to read '%s'\n", path);
		fclose(in);
		return -1;
	}
	fclose(in);
	if (rc == 0 && lineno == 0) {
		snprintf(why, sizeof(why), "empty file (no header)");
		lineno = 1;
		rc = -1;
	} else if (rc == 0 && d->n == 0) {
		snprintf(why, sizeof(why), "no steps after the header");
		lineno++;
		rc = -1;
	}
	if (rc < 0)
		fprintf(stderr, "meshrun plot: '%s' line %ld: %s\n", path, lineno, why);
	return rc;
}

/* Round tick spacing for about `want` ticks over [lo, hi]. */
static double tick_step(double lo, double hi, int want)
{
	double raw = (hi - lo) / want, mag = pow(10.0, floor(log10(raw))), r = raw / mag;

	return (r < 1.5 ? 1.0 : r < 3.5 ? 2.0 : r < 7.5 ? 5.0 : 10.0) * mag;
}

/* s with XML's special characters escaped. */
static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		default:
			/* control characters are not allowed in XML 1.0 */
			fputc((unsigned char)*s < 0x20 ? '?' : *s, f);
		}
	}
}

struct frame {
	double x0, x1, y0, y1; /* data ranges */
};

static double px(const struct frame *fr, double x)
{
	return PLOT_L + (x - fr->x0) / (fr->x1 - fr->x0) * (PLOT_W - PLOT_L - PLOT_R);
}

static double py(const struct frame *fr, double y)
{
	return PLOT_H - PLOT_B - (y - fr->y0) / (fr->y1 - fr->y0) * (PLOT_H - PLOT_T - PLOT_B);
}

static void axes(FILE *f, const struct frame *fr)
{
	double xs = tick_step(fr->x0, fr->x1, 8), ys = tick_step(fr->y0, fr->y1, 6);
	double bottom = PLOT_H - PLOT_B;

	fprintf(f, "<g id=\"axes\" stroke=\"#333\" stroke-width=\"1\">\n"
		   "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n"
		   "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n</g>\n",
		PLOT_L, bottom, PLOT_W - PLOT_R, bottom, PLOT_L, PLOT_T, PLOT_L, bottom);
	fputs("<g id=\"xticks\" font-size=\"12\" text-anchor=\"middle\">\n", f);
	for (double t = ceil(fr->x0 / xs) * xs; t <= fr->x1 + xs * 1e-9; t += xs)
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
			   "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n",
			px(fr, t), bottom, px(fr, t), bottom + 5, px(fr, t), bottom + 18, t);
	fputs("</g>\n<g id=\"yticks\" font-size=\"12\" text-anchor=\"end\">\n", f);
	for (double t = ceil(fr->y0 / ys) * ys; t <= fr->y1 + ys * 1e-9; t += ys) {
		double v = fabs(t) < ys * 1e-9 ? 0.0 : t; /* not "-0" or "1e-17" */
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ccc\"/>"
			   "<text x=\"%.1f\" y=\"%.1f\">%.4g</text>\n",
			PLOT_L, py(fr, t), PLOT_W - PLOT_R, py(fr, t), PLOT_L - 6, py(fr, t) + 4, v);
	}
	fprintf(f, "</g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">"
		   "step</text>\n"
		   "<text x=\"16\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" "
		   "transform=\"rotate(-90 16 %.1f)\">loss</text>\n",
		(PLOT_L + PLOT_W - PLOT_R) / 2, PLOT_H - 14, (PLOT_T + bottom) / 2,
		(PLOT_T + bottom) / 2);
}

/* The picture of d into f, titled title. */
static void draw(FILE *f, const struct plot_data *d, const char *title)
{
	struct frame fr = { d->step[0], d->step[d->n - 1], INFINITY, -INFINITY };
	double pad;

	for (long i = 0; i < d->n; i++) {
		fr.y0 = fmin(fr.y0, d->loss[i]);
		fr.y1 = fmax(fr.y1, d->loss[i]);
		if (!isnan(d->val[i])) {
			fr.y0 = fmin(fr.y0, d->val[i]);
			fr.y1 = fmax(fr.y1, d->val[i]);
		}
	}
	if (fr.x1 <= fr.x0) { /* one step */
		fr.x0 -= 1;
		fr.x1 += 1;
	}
	pad = fr.y1 > fr.y0 ? (fr.y1 - fr.y0) * 0.05 : 0.5;
	fr.y0 -= pad;
	fr.y1 += pad;
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
		   "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n<title>",
		PLOT_W, PLOT_H, PLOT_W, PLOT_H);
	xml_text(f, title);
	fprintf(f, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
		   "<text x=\"%.1f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">",
		PLOT_W / 2);
	xml_text(f, title);
	fputs("</text>\n", f);
	axes(f, &fr);
	fputs("<polyline id=\"train\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" "
	      "points=\"",
	      f);
	for (long i = 0; i < d->n; i++)
		fprintf(f, "%s%.2f,%.2f", i ? " " : "", px(&fr, d->step[i]), py(&fr, d->loss[i]));
	fputs("\"/>\n<g id=\"val\" fill=\"#d62728\">\n", f);
	for (long i = 0; i < d->n; i++)
		if (!isnan(d->val[i]))
			fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\"/>\n", px(&fr, d->step[i]),
				py(&fr, d->val[i]));
	fprintf(f, "</g>\n<g id=\"legend\" font-size=\"12\">\n"
		   "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" "
		   "stroke-width=\"1.5\"/><text x=\"%.1f\" y=\"%.1f\">train loss</text>\n",
		PLOT_W - PLOT_R - 150, PLOT_T + 12, PLOT_W - PLOT_R - 126, PLOT_T + 12,
		PLOT_W - PLOT_R - 120, PLOT_T + 16);
	if (d->nval)
		fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#d62728\"/>"
			   "<text x=\"%.1f\" y=\"%.1f\">val loss</text>\n",
			PLOT_W - PLOT_R - 138, PLOT_T + 30, PLOT_W - PLOT_R - 120, PLOT_T + 34);
	fputs("</g>\n</svg>\n", f);
}

/* LOSS_LOG with its extension replaced by .svg (appended without one). */
static void default_out(char *out, size_t cap, const char *in)
{
	const char *slash = strrchr(in, '/'), *dot = strrchr(in, '.');
	size_t n = dot && (!slash || dot > slash + 1) ? (size_t)(dot - in) : strlen(in);

	snprintf(out, cap, "%.*s.svg", (int)n, in);
}

int mr_cli_plot(int argc, char **argv)
{
	static const char *usage = "LOSS_LOG [-o OUT.svg] [--title TEXT]";
	struct plot_opts o;
	struct mr_config cfg = { 0 };
	struct mr_errbuf eb = { 0 };
	struct plot_data d = { 0 };
	char **args = calloc((size_t)argc + 1, sizeof(char *));
	const char *in;
	FILE *f;
	int rc;

	if (!args) {
		fprintf(stderr, "meshrun plot: out of memory\n");
		return 1;
	}
	for (int i = 0; i < argc; i++) /* -o is --out */
		args[i] = strcmp(argv[i], "-o") ? argv[i] : "--out";
	rc = mr_config_init(&cfg, plot_table, sizeof(plot_table) / sizeof(plot_table[0]), &o, &eb);
	cfg.prog = "meshrun plot";
	cfg.usage = usage;
	cfg.summary = "Draw a loss_log (the gpt worker's, with its header line) as an SVG: "
		      "training loss per step, validation loss where it ran.";
	cfg.config_file = 0;
	cfg.allow_positional = 1;
	if (rc == 0)
		rc = mr_config_parse(&cfg, argc, args, &eb);
	if (rc == MR_CONFIG_HELP) {
		rc = 0;
		goto out;
	}
	if (rc == 0 && cfg.nargs != 1)
		rc = mr_errf(&eb, MR_EINVAL, "want one LOSS_LOG, got %d (usage: meshrun plot %s)",
			     cfg.nargs, usage);
	if (rc < 0) {
		fprintf(stderr, "meshrun plot: %s\n", eb.msg);
		rc = MR_CONFIG_EXIT_USAGE;
		goto out;
	}
	in = cfg.args[0];
	if (!o.out[0])
		default_out(o.out, sizeof(o.out), in);
	if (!strcmp(o.out, in)) {
		fprintf(stderr, "meshrun plot: the output '%s' is the input; name another with -o\n",
			o.out);
		rc = MR_CONFIG_EXIT_USAGE;
		goto out;
	}
	if (read_log(in, &d) < 0) {
		rc = 1;
		goto out;
	}
	if (!(f = fopen(o.out, "w"))) {
		fprintf(stderr, "meshrun plot: unable to write '%s': %s\n", o.out, strerror(errno));
		rc = 1;
		goto out;
	}
	draw(f, &d, o.title[0] ? o.title : in);
	if (fclose(f) != 0) {
		fprintf(stderr, "meshrun plot: unable to write '%s'\n", o.out);
		rc = 1;
		goto out;
	}
	printf("%s: %ld steps, %ld validation losses\n", o.out, d.n, d.nval);
	rc = 0;
out:
	data_free(&d);
	mr_config_release(&cfg);
	free(args);
	return rc;
}
