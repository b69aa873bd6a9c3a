// Tokenizer files in llm.c's format, used to decode samples to text:
//   header: 256 uint32 = [20240328, 2, vocab_size, eot_token, 0...]
//   then for each token: one uint8 length, then that many bytes.
// The default dataset uses the byte-level tokenizer (token i = byte i, 256 = end-of-text);
// tinyshakespeare uses GPT-2's 50257 BPE tokens. Both are written by dev/data/.
#pragma once

#include "../common.h"

#define TOKENIZER_MAGIC 20240328

typedef struct {
    int vocab_size;
    int eot_token;
    char** token_bytes;   // token_bytes[i]: NUL-terminated bytes of token i
    unsigned char* token_len;
} Tokenizer;

static inline void tokenizer_load(Tokenizer* tok, const char* path) {
    FILE* f = fopen_or_die(path, "rb");
    uint32_t header[256];
    fread_or_die(header, sizeof(uint32_t), 256, f, path);
    if (header[0] != TOKENIZER_MAGIC) {
        die("'%s' is not a tokenizer file: magic %u, expected %d", path, header[0], TOKENIZER_MAGIC);
    }
    if (header[1] != 2) { die("'%s': tokenizer version %u, expected 2", path, header[1]); }
    tok->vocab_size = (int)header[2];
    tok->eot_token = (int)header[3];
    if (tok->vocab_size <= 0 || tok->vocab_size > 65536 || tok->eot_token < 0 || tok->eot_token >= tok->vocab_size) {
        die("'%s': invalid vocab size %d or eot token %d", path, tok->vocab_size, tok->eot_token);
    }
    tok->token_bytes = (char**)malloc(tok->vocab_size * sizeof(char*));
    tok->token_len = (unsigned char*)malloc(tok->vocab_size);
    for (int i = 0; i < tok->vocab_size; i++) {
        unsigned char len;
        fread_or_die(&len, 1, 1, f, path);
        if (len == 0) { die("'%s': token %d has length 0", path, i); }
        tok->token_bytes[i] = (char*)malloc(len + 1);
        fread_or_die(tok->token_bytes[i], 1, len, f, path);
        tok->token_bytes[i][len] = '\0';
        tok->token_len[i] = len;
    }
    long end = ftell(f), size = file_size_or_die(f, path);   // nothing after the last token: a file cut from another one,
    if (size != end) {                                      // or one whose header's vocabulary is too small, is refused
        die("'%s' has %ld bytes after its %d tokens (%ld bytes in all): the header's vocabulary does not cover the file", path,
            size - end, tok->vocab_size, size);
    }
    fclose(f);
}

static inline const char* tokenizer_decode(const Tokenizer* tok, int id) {
    if (id < 0 || id >= tok->vocab_size) { return "<?>"; }
    return tok->token_bytes[id];
}

// Print a token so a terminal shows it: printable bytes as they are, others as \xNN.
static inline void tokenizer_print(const Tokenizer* tok, int id) {
    if (id == tok->eot_token) { printf("<|eot|>"); return; }
    const unsigned char* s = (const unsigned char*)tokenizer_decode(tok, id);
    int len = (id >= 0 && id < tok->vocab_size) ? tok->token_len[id] : 3;
    for (int i = 0; i < len; i++) {
        // bytes >= 128 are parts of UTF-8 characters: print them raw only inside multi-byte tokens
        int printable = s[i] == '\n' || s[i] == '\t' || (s[i] >= 32 && s[i] < 127) || (s[i] >= 128 && len > 1);
        if (printable) { putchar(s[i]); }
        else { printf("\\x%02x", s[i]); }
    }
}

static inline void tokenizer_free(Tokenizer* tok) {
    for (int i = 0; i < tok->vocab_size; i++) { free(tok->token_bytes[i]); }
    free(tok->token_bytes);
    free(tok->token_len);
}
