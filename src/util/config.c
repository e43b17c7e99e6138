#include "config.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

int ema__config_parse_size(const char *str, size_t *size_p)
{
    char *end;
    unsigned long long v;
    unsigned shift = 0;

    if (str == NULL) {
        return -1;
    }
    while (isspace((unsigned char)*str)) {
        str++;
    }
    if (!isdigit((unsigned char)*str)) {
        return -1; /* rejects "", "-1", "M" */
    }
    errno = 0;
    v = strtoull(str, &end, 10);
    if (errno != 0) {
        return -1;
    }
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: return -1;
    }
    if (shift != 0 && (*end == 'b' || *end == 'B')) {
        end++; /* accept 2MB as well as 2M */
    }
    while (isspace((unsigned char)*end)) {
        end++;
    }
    if (*end != '\0') {
        return -1;
    }
    /* Beyond EMA_CONFIG_SIZE_MAX is no machine's memory, only an overflow
     * waiting to happen where the value is later counted in segments. */
    if (v > (EMA_CONFIG_SIZE_MAX >> shift)) {
        return -1;
    }
    *size_p = (size_t)(v << shift);
    return 0;
}

static int config_size_parse(const char *str, void *dst, const void *arg)
{
    return ema__config_parse_size(str, (size_t *)dst);
}

static void config_size_print(char *buf, size_t max, const void *src, const void *arg)
{
    size_t v = *(const size_t *)src;
    static const char suffix[] = {'\0', 'K', 'M', 'G', 'T'};
    int i = 0;
    while (i < 4 && v != 0 && (v % 1024) == 0) {
        v /= 1024;
        i++;
    }
    if (i == 0) {
        snprintf(buf, max, "%zu", v);
    } else {
        snprintf(buf, max, "%zu%c", v, suffix[i]);
    }
}

const ema_config_parser_t ema__config_size = {config_size_parse, config_size_print,
                                              NULL, "size: 4096, 64K, 2M, 1G, at most 1024T"};

static int config_bool_parse(const char *str, void *dst, const void *arg)
{
    static const char *yes[] = {"1", "y", "yes", "on", "true"};
    static const char *no[]  = {"0", "n", "no", "off", "false"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (!strcasecmp(str, yes[i])) {
            *(int *)dst = 1;
            return 0;
        }
        if (!strcasecmp(str, no[i])) {
            *(int *)dst = 0;
            return 0;
        }
    }
    return -1;
}

static void config_bool_print(char *buf, size_t max, const void *src, const void *arg)
{
    snprintf(buf, max, "%s", *(const int *)src ? "y" : "n");
}

const ema_config_parser_t ema__config_bool = {config_bool_parse, config_bool_print,
                                              NULL, "bool: y|n"};

static int config_uint_parse(const char *str, void *dst, const void *arg)
{
    char *end;
    unsigned long long v;
    if (!isdigit((unsigned char)*str)) {
        return -1; /* rejects "", "-1" (strtoull would negate it), "+1", " 1" */
    }
    errno = 0;
    v = strtoull(str, &end, 10);
    if (errno != 0 || *end != '\0' || v > UINT32_MAX) {
        return -1;
    }
    *(unsigned *)dst = (unsigned)v;
    return 0;
}

static void config_uint_print(char *buf, size_t max, const void *src, const void *arg)
{
    snprintf(buf, max, "%u", *(const unsigned *)src);
}

const ema_config_parser_t ema__config_uint = {config_uint_parse, config_uint_print,
                                              NULL, "unsigned integer"};

/*
 * Doubles are seconds (timeouts): finite, from 0 to EMA_CONFIG_DOUBLE_MAX.
 * strtod also takes "nan", "inf", "infinity", "-0" and "1e308", which as a
 * timeout meant "no timeout" or an overflow where it is converted to an
 * integer; none of them is a duration anyone means.
 */
static int config_double_parse(const char *str, void *dst, const void *arg)
{
    char *end;
    double v;
    while (isspace((unsigned char)*str)) {
        str++;
    }
    if (!isdigit((unsigned char)*str) && *str != '.') {
        return -1; /* rejects "", "-0", "+1", "nan", "inf" */
    }
    if (strpbrk(str, "xXpP") != NULL) {
        return -1; /* decimals only: strtod would take "0x10" and "0x1.8p0" */
    }
    errno = 0;
    v = strtod(str, &end);
    while (isspace((unsigned char)*end)) {
        end++; /* blanks around the number are ignored, as around a size */
    }
    if (errno != 0 || end == str || *end != '\0' || !isfinite(v) || v < 0 ||
        v > EMA_CONFIG_DOUBLE_MAX) {
        return -1;
    }
    *(double *)dst = v;
    return 0;
}

static void config_double_print(char *buf, size_t max, const void *src, const void *arg)
{
    snprintf(buf, max, "%g", *(const double *)src);
}

const ema_config_parser_t ema__config_double = {config_double_parse,
                                                config_double_print, NULL,
                                                "a number from 0 to 1e9: 0.5, 2, 1e3"};

/* Strings point into the environment or into the table's default, both of
 * which outlive the config. */
static int config_string_parse(const char *str, void *dst, const void *arg)
{
    *(const char **)dst = str;
    return 0;
}

static void config_string_print(char *buf, size_t max, const void *src, const void *arg)
{
    const char *s = *(const char *const *)src;
    snprintf(buf, max, "%s", s ? s : "");
}

const ema_config_parser_t ema__config_string = {config_string_parse,
                                                config_string_print, NULL, "string"};

/* arg is a NULL-terminated array of names; the value stored is the index. */
int ema__config_enum_parse(const char *str, void *dst, const void *arg)
{
    const char *const *names = arg;
    for (int i = 0; names[i] != NULL; i++) {
        if (!strcasecmp(str, names[i])) {
            *(int *)dst = i;
            return 0;
        }
    }
    return -1;
}

void ema__config_enum_print(char *buf, size_t max, const void *src, const void *arg)
{
    const char *const *names = arg;
    snprintf(buf, max, "%s", names[*(const int *)src]);
}

static void config_enum_syntax(const ema_config_field_t *f, char *buf, size_t max)
{
    if (f->parser->parse != ema__config_enum_parse) {
        snprintf(buf, max, "%s", f->parser->syntax);
        return;
    }
    const char *const *names = f->parser->arg;
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; names[i] != NULL && n < max; i++) {
        n += snprintf(buf + n, max - n, "%s%s", i ? "|" : "", names[i]);
    }
}

static int config_skipped(const char *name, const char *const *skip)
{
    for (; skip != NULL && *skip != NULL; skip++) {
        if (!strcmp(name, *skip)) {
            return 1;
        }
    }
    return 0;
}

ema_status_t ema__config_read_skip(const ema_config_field_t *table, void *opts,
                                   const char *const *skip)
{
    ema_status_t status = EMA_SUCCESS;
    char var[128];

    /* Every field is read, whatever fails before it: each bad variable is
     * reported (one run shows them all) and gets its default, and the
     * others keep the values the environment sets (ema_config_print shows
     * them so). */
    for (const ema_config_field_t *f = table; f->name != NULL; f++) {
        void *dst = (char *)opts + f->offset;
        if (f->parser->parse(f->dfl, dst, f->parser->arg) != 0) {
            ema_error("internal: bad default '%s' for EMA_%s", f->dfl, f->name);
            status = EMA_ERR_INVALID_PARAM;
            continue;
        }
        snprintf(var, sizeof(var), "EMA_%s", f->name);
        const char *val = getenv(var);
        if (val == NULL || config_skipped(f->name, skip)) {
            continue;
        }
        if (f->parser->parse(val, dst, f->parser->arg) != 0) {
            char syntax[256];
            config_enum_syntax(f, syntax, sizeof(syntax));
            ema_error("invalid value '%s' for %s (expected %s)", val, var, syntax);
            /* restore the default so that a failed read leaves sane values */
            f->parser->parse(f->dfl, dst, f->parser->arg);
            status = EMA_ERR_INVALID_PARAM;
        }
    }
    return status;
}

ema_status_t ema__config_read(const ema_config_field_t *table, void *opts)
{
    return ema__config_read_skip(table, opts, NULL);
}

void ema__config_print(const ema_config_field_t *table, const void *opts, FILE *stream)
{
    char value[256], syntax[256];

    for (const ema_config_field_t *f = table; f->name != NULL; f++) {
        f->parser->print(value, sizeof(value), (const char *)opts + f->offset, f->parser->arg);
        config_enum_syntax(f, syntax, sizeof(syntax));
        fprintf(stream, "#\n# %s\n# syntax: %s, default: %s\n#\nEMA_%s=%s\n", f->help, syntax,
                f->dfl, f->name, value);
    }
}

void ema__config_warn_unknown(const ema_config_field_t *const *tables)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "EMA_", 4) != 0) {
            continue;
        }
        const char *name = *e + 4;
        size_t len = strcspn(name, "=");
        int known = 0;
        for (int t = 0; tables[t] != NULL && !known; t++) {
            for (const ema_config_field_t *f = tables[t]; f->name != NULL; f++) {
                if (strlen(f->name) == len && !strncmp(f->name, name, len)) {
                    known = 1;
                    break;
                }
            }
        }
        if (!known) {
            ema_warn("unknown environment variable EMA_%.*s ignored (see ema_info -c)",
                     (int)len, name);
        }
    }
}

/* A size, or "auto" (stored as 0) for a default that depends on other settings. */
static int config_size_auto_parse(const char *str, void *dst, const void *arg)
{
    if (!strcasecmp(str, "auto")) {
        *(size_t *)dst = 0;
        return 0;
    }
    return ema__config_parse_size(str, (size_t *)dst);
}

static void config_size_auto_print(char *buf, size_t max, const void *src, const void *arg)
{
    if (*(const size_t *)src == 0) {
        snprintf(buf, max, "auto");
    } else {
        config_size_print(buf, max, src, arg);
    }
}

const ema_config_parser_t ema__config_size_auto = {config_size_auto_parse,
                                                   config_size_auto_print, NULL,
                                                   "auto or a size: 4096, 64K, 2M, 1G, at most 1024T"};
