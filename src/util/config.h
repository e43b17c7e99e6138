/*
 * Configuration tables, UCX style: each module keeps one table of
 * {name, default, help, offset, parser} describing the fields of its config
 * struct.  Tables are read once at ema_init(), and this is the only code that
 * reads an EMA_* variable.  The library's other getenv() calls read variables
 * that belong to others: the launcher's PMIX_* (boot/boot.c, to tell a
 * launched process from a singleton) and CUDA_VISIBLE_DEVICES
 * (topo/placement.c, to number GPUs as CUDA does).
 */
#ifndef EMA_UTIL_CONFIG_H_
#define EMA_UTIL_CONFIG_H_

#include <ema.h>
#include <stddef.h>
#include <stdio.h>

typedef struct ema_config_parser {
    /* Parse @a str into @a dst; return 0 on success, -1 if invalid. */
    int         (*parse)(const char *str, void *dst, const void *arg);
    /* Write the value at @a src into @a buf as the user would type it. */
    void        (*print)(char *buf, size_t max, const void *src, const void *arg);
    const void  *arg;   /* e.g. the names of an enum */
    const char  *syntax;
} ema_config_parser_t;

typedef struct ema_config_field {
    const char                *name;     /* without the EMA_ prefix */
    const char                *dfl;      /* default, as a string */
    const char                *help;
    size_t                     offset;   /* in the module's config struct */
    const ema_config_parser_t *parser;
} ema_config_field_t;

/* The largest size a size variable takes: 1024T (2^50), as ema_win_allocate's
 * largest window, beyond any machine's memory. */
#define EMA_CONFIG_SIZE_MAX   ((size_t)1 << 50)
/* The largest number a double variable (seconds) takes: about 31 years. */
#define EMA_CONFIG_DOUBLE_MAX 1e9

extern const ema_config_parser_t ema__config_size;   /* 4096, 64K, 256M, 2G, 1T; <= 1024T */
extern const ema_config_parser_t ema__config_bool;   /* y/n, yes/no, 1/0, on/off, true/false */
extern const ema_config_parser_t ema__config_uint;   /* unsigned */
extern const ema_config_parser_t ema__config_double; /* 0.5, 1e-3; finite, 0 to 1e9 */
extern const ema_config_parser_t ema__config_string;
extern const ema_config_parser_t ema__config_size_auto; /* "auto" (0) or a size */
#define EMA_CONFIG_ENUM(_names) {ema__config_enum_parse, ema__config_enum_print, _names, "enum"}
int  ema__config_enum_parse(const char *str, void *dst, const void *arg);
void ema__config_enum_print(char *buf, size_t max, const void *src, const void *arg);

/* Table terminated by an entry with name == NULL. */
#define EMA_CONFIG_TABLE_END {NULL, NULL, NULL, 0, NULL}

/*
 * Fill @a opts from the defaults, then from EMA_<name> in the environment.
 * A bad value logs one clear line and leaves its field at the default; the
 * other fields are read all the same, and the call returns
 * EMA_ERR_INVALID_PARAM.
 */
ema_status_t ema__config_read(const ema_config_field_t *table, void *opts);
/* The same, leaving the variables named in @skip (names without "EMA_",
 * NULL-terminated; NULL: none) at their defaults: ema_init's parameters
 * set those fields instead. */
ema_status_t ema__config_read_skip(const ema_config_field_t *table, void *opts,
                                   const char *const *skip);

/* Print each field as "EMA_NAME=value  # help (default: dfl)". */
void ema__config_print(const ema_config_field_t *table, const void *opts, FILE *stream);

/* Warn about EMA_* variables that no table knows (typos). */
void ema__config_warn_unknown(const ema_config_field_t *const *tables);

/* Parse a size such as "2M" (at most EMA_CONFIG_SIZE_MAX); exposed for the
 * unit tests. */
int ema__config_parse_size(const char *str, size_t *size_p);

#endif
