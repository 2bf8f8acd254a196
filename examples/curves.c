/* curves.c: the examples' training curves as CSV and SVG (see curves.h). */
#include "curves.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool add(curve_point **pts, int64_t *n, int64_t *cap, int64_t step, int epoch, double v) {
    if (*n == *cap) {
        int64_t grown = *cap ? 2 * *cap : 1024;
        curve_point *p = realloc(*pts, sizeof *p * (size_t)grown);
        if (!p) return false;
        *pts = p;
        *cap = grown;
    }
    (*pts)[(*n)++] = (curve_point){step, epoch, v};
    return true;
}

bool curves_add_loss(curves *c, int64_t step, int epoch, double loss) {
    return add(&c->loss, &c->nloss, &c->cap_loss, step, epoch, loss);
}

bool curves_add_eval(curves *c, int64_t step, int epoch, double value) {
    return add(&c->eval, &c->neval, &c->cap_eval, step, epoch, value);
}

bool curves_tensorboard(curves *c, const char *dir, cddp_error *err) {
    return (c->tb = cddp_summary_open(dir, err)) != NULL;
}

void curves_scalar(curves *c, const char *tag, int64_t step, double value) {
    cddp_error err = {0};
    if (!c->tb || cddp_summary_scalar(c->tb, tag, step, value, &err) == CDDP_OK) return;
    fprintf(stderr, "curves: TensorBoard's file: %s; the run goes on without it\n", err.msg);
    cddp_summary_close(c->tb, NULL);
    c->tb = NULL;
}

void curves_ddp(curves *c, const cddp_ddp *ddp, int64_t step) {
    cddp_ddp_stats st = cddp_ddp_stats_get(ddp);
    if (!st.compared_at || st.compared_at == c->compared_at) return;
    c->compared_at = st.compared_at;
    curves_scalar(c, "ddp/slowest_rank_pct", step, st.slowest_pct);
    curves_scalar(c, "ddp/straggler_rank", step, st.straggler);
}

void curves_free(curves *c) {
    cddp_summary_close(c->tb, NULL);
    c->tb = NULL;
    free(c->loss);
    free(c->eval);
    c->loss = c->eval = NULL;
    c->nloss = c->neval = c->cap_loss = c->cap_eval = 0;
}

static void load_csv(const char *dir, const char *name, curves *c, bool eval) {
    char path[4096], line[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        long long step;
        int epoch;
        double v;
        if (sscanf(line, "%lld,%d,%lf", &step, &epoch, &v) != 3) continue; /* the header */
        if (eval)
            curves_add_eval(c, step, epoch, v);
        else
            curves_add_loss(c, step, epoch, v);
    }
    fclose(f);
}

void curves_load(curves *c, const char *dir) {
    load_csv(dir, "loss.csv", c, false);
    load_csv(dir, "eval.csv", c, true);
}

static bool save_csv(const char *dir, const char *name, const char *value, const curve_point *p,
                     int64_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "step,epoch,%s\n", value);
    for (int64_t i = 0; i < n; i++)
        fprintf(f, "%lld,%d,%.6g\n", (long long)p[i].step, p[i].epoch, p[i].value);
    return fclose(f) == 0;
}

/* ---- drawing ------------------------------------------------------------------------------ */

/* A round tick spacing (1, 2 or 5 times a power of ten) giving about `want` ticks over span. */
static double tick_step(double span, int want) {
    if (!(span > 0)) return 1;
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

typedef struct panel {
    double x0, y0, w, h;       /* the plot area, in SVG pixels */
    double xlo, xhi, ylo, yhi; /* the data range shown */
} panel;

static double px(const panel *p, double x) {
    return p->x0 + (p->xhi > p->xlo ? (x - p->xlo) / (p->xhi - p->xlo) : 0.5) * p->w;
}

static double py(const panel *p, double y) {
    double t = p->yhi > p->ylo ? (y - p->ylo) / (p->yhi - p->ylo) : 0.5;
    return p->y0 + p->h - fmin(fmax(t, 0), 1) * p->h;
}

static void text(FILE *f, double x, double y, const char *anchor, const char *extra,
                 const char *s) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>", x, y, anchor, extra);
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else
            fputc(*s, f);
    }
    fputs("</text>\n", f);
}

/* The frame, grid lines with tick labels on both axes, the axis labels and the epochs' starts. */
static void axes(FILE *f, const panel *p, const char *xlabel, const char *ylabel,
                 const curve_point *marks, int64_t nmarks) {
    char s[64];
    double xs = tick_step(p->xhi - p->xlo, 6), ys = tick_step(p->yhi - p->ylo, 5);
    for (double x = ceil(p->xlo / xs) * xs; x <= p->xhi + 1e-9 * xs; x += xs) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
                px(p, x), p->y0, px(p, x), p->y0 + p->h);
        snprintf(s, sizeof s, "%g", x);
        text(f, px(p, x), p->y0 + p->h + 16, "middle", "", s);
    }
    for (double y = ceil(p->ylo / ys) * ys; y <= p->yhi + 1e-9 * ys; y += ys) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
                p->x0, py(p, y), p->x0 + p->w, py(p, y));
        snprintf(s, sizeof s, "%g", fabs(y) < 1e-12 ? 0 : y);
        text(f, p->x0 - 6, py(p, y) + 4, "end", "", s);
    }
    /* Each epoch's first step (after the first shown). */
    for (int64_t i = 1; i < nmarks; i++) {
        if (marks[i].epoch == marks[i - 1].epoch) continue;
        double x = px(p, (double)marks[i].step);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" "
                "stroke-dasharray=\"4 3\"/>\n",
                x, p->y0, x, p->y0 + p->h);
        snprintf(s, sizeof s, "epoch %d", marks[i].epoch);
        text(f, x + 3, p->y0 + 12, "start", " fill=\"#666\" font-size=\"11\"", s);
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#444\"/>\n",
            p->x0, p->y0, p->w, p->h);
    text(f, p->x0 + p->w / 2, p->y0 + p->h + 36, "middle", "", xlabel);
    char rot[96];
    snprintf(rot, sizeof rot, " transform=\"rotate(-90 %.1f %.1f)\"", p->x0 - 46, p->y0 + p->h / 2);
    text(f, p->x0 - 46, p->y0 + p->h / 2, "middle", rot, ylabel);
}

static void polyline(FILE *f, const panel *p, const double *x, const double *y, int64_t n,
                     const char *color, double width) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"", color,
            width);
    for (int64_t i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", px(p, x[i]), py(p, y[i]));
    fprintf(f, "\"/>\n");
}

static bool draw(const curves *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    const double W = 960, H = 400;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    text(f, W / 2, 22, "middle", " font-size=\"15\" font-weight=\"bold\"",
         c->title ? c->title : "training");
    int64_t n = c->nloss;
    double xlo = n ? (double)c->loss[0].step : 0, xhi = n ? (double)c->loss[n - 1].step : 1;
    for (int64_t i = 0; i < c->neval; i++) {
        xlo = fmin(xlo, (double)c->eval[i].step);
        xhi = fmax(xhi, (double)c->eval[i].step);
    }
    if (xhi <= xlo) xhi = xlo + 1;

    /* The loss: every step, faint, and the mean of the last k steps over it. */
    double ymax = 0;
    for (int64_t i = 0; i < n; i++) ymax = fmax(ymax, c->loss[i].value);
    double ys = tick_step(ymax, 5);
    panel lp = {80, 50, 380, 270, xlo, xhi, 0, ymax > 0 ? ceil(ymax / ys) * ys : 1};
    axes(f, &lp, "step", "training loss", c->loss, n);
    int64_t k = n / 40 < 1 ? 1 : n / 40 > 200 ? 200 : n / 40;
    /* x and y hold the loss's points, then the evaluation's */
    size_t points = (size_t)(n > c->neval ? n : c->neval > 0 ? c->neval : 1);
    double *x = malloc(sizeof(double) * points), *y = malloc(sizeof(double) * points),
           *m = malloc(sizeof(double) * points);
    if (x && y && m && n) {
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            x[i] = (double)c->loss[i].step;
            y[i] = c->loss[i].value;
            sum += y[i] - (i >= k ? y[i - k] : 0);
            m[i] = sum / (double)(i + 1 < k ? i + 1 : k);
        }
        polyline(f, &lp, x, y, n, "#9ecae1", 1);
        polyline(f, &lp, x, m, n, "#08519c", 2);
    }
    char legend[96];
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#9ecae1\"/>\n",
            lp.x0 + lp.w - 150, lp.y0 + 26.0, lp.x0 + lp.w - 130, lp.y0 + 26.0);
    text(f, lp.x0 + lp.w - 125, lp.y0 + 30, "start", "", "each step");
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#08519c\" "
            "stroke-width=\"2\"/>\n",
            lp.x0 + lp.w - 150, lp.y0 + 44.0, lp.x0 + lp.w - 130, lp.y0 + 44.0);
    snprintf(legend, sizeof legend, "mean of %lld steps", (long long)k);
    text(f, lp.x0 + lp.w - 125, lp.y0 + 48, "start", "", legend);

    /* The evaluation: a point per evaluation, with its value. */
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < c->neval; i++) {
        lo = fmin(lo, c->eval[i].value);
        hi = fmax(hi, c->eval[i].value);
    }
    if (!c->neval) lo = 0, hi = 1;
    panel ep = {560, 50, 380, 270, xlo, xhi, 0, 1};
    if (c->eval_is_fraction) {
        ep.ylo = fmax(0, floor(lo * 10 - 0.5) / 10);
        ep.yhi = 1;
    } else {
        double s = tick_step(hi, 5);
        ep.ylo = 0;
        ep.yhi = hi > 0 ? ceil(hi * 1.05 / s) * s : 1;
    }
    axes(f, &ep, "step", c->eval_label ? c->eval_label : "evaluation", c->loss, n);
    if (x && y && c->neval) {
        for (int64_t i = 0; i < c->neval; i++) {
            x[i] = (double)c->eval[i].step;
            y[i] = c->eval[i].value;
        }
        if (c->neval > 1) polyline(f, &ep, x, y, c->neval, "#cb181d", 2);
        for (int64_t i = 0; i < c->neval; i++) {
            char v[32];
            snprintf(v, sizeof v, c->eval_is_fraction ? "%.4f" : "%.3f", y[i]);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#cb181d\"/>\n",
                    px(&ep, x[i]), py(&ep, y[i]));
            text(f, px(&ep, x[i]), py(&ep, y[i]) + (py(&ep, y[i]) < ep.y0 + 30 ? 18 : -9),
                 i == c->neval - 1 && c->neval > 1 ? "end" : "middle", "", v);
        }
    }
    free(x);
    free(y);
    free(m);
    fprintf(f, "</svg>\n");
    return fclose(f) == 0;
}

bool curves_save(const curves *c, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/curves.svg", dir);
    return save_csv(dir, "loss.csv", "loss", c->loss, c->nloss) &&
           save_csv(dir, "eval.csv", c->eval_label ? c->eval_label : "value", c->eval, c->neval) &&
           draw(c, path);
}
