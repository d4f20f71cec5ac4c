/* tests/test_data_text.c — the data pipeline's byte-level text: windows,
 * batches, folders of files, unreadable and empty corpora, and the
 * fortunes corpus where it is installed. Fixtures are written into a fresh
 * temporary directory at run time. */
#include <dirent.h>
#include <sys/wait.h>

#include "tests/data_check.h"

/* ---- text ------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    write_bytes(path, text, strlen(text), 0);
}

/* Batch `index` of token windows: x and y are (bs, T) i32. */
static void read_tokens(mpt_dataset *d, int64_t index, int64_t bs, int32_t *x, int32_t *y,
                        int64_t *real) {
    int64_t T = mpt_data_sample_shape(d).dim[0], dims[2] = {bs, T};
    mpt_tensor xt = tensor(MPT_DT_I32, 2, dims), yt = tensor(MPT_DT_I32, 2, dims);
    int rc = mpt_data_batch(d, index, bs, &xt, &yt, real, err, sizeof err);
    CHECK_MSG(rc == 0, "batch %lld: %s", (long long)index, err);
    memcpy(x, xt.data, sizeof(int32_t) * (size_t)(bs * T));
    memcpy(y, yt.data, sizeof(int32_t) * (size_t)(bs * T));
    free(xt.data);
    free(yt.data);
}

/* 1 when the T ids equal the bytes of s. */
static int ids_are(const int32_t *ids, const char *s, int64_t T) {
    for (int64_t j = 0; j < T; j++)
        if (ids[j] != (uint8_t)s[j])
            return 0;
    return 1;
}

/* Every window of train then test: x's first bytes and the last y byte
 * spell the corpus up to its last target. seq_len=1 keeps this simple. */
static void check_corpus(const char *spec, const char *want) {
    mpt_dataset *parts[2];
    char got[256];
    int64_t len = 0, real;
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &parts[0], err, sizeof err) == 0,
              "%s", err);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TEST, NO_SHAPE, &parts[1], err, sizeof err) == 0,
              "%s", err);
    for (int p = 0; p < 2 && parts[0] && parts[1]; p++)
        for (int64_t i = 0; i < mpt_data_count(parts[p]) && len < 250; i++) {
            int32_t x, y;
            read_tokens(parts[p], i, 1, &x, &y, &real);
            got[len++] = (char)x;
            got[len] = (char)y;
        }
    got[len + 1] = 0;
    CHECK_MSG(!strcmp(got, want), "corpus '%s', want '%s'", got, want);
    mpt_data_free(parts[0]);
    mpt_data_free(parts[1]);
}

/* "hello world\n" in windows of 4 + 1 bytes: "hello" and "o wor" (2 = 11 / 4
 * windows; "ld\n" is left over). 90% of 2 windows is 1 for training. */
static void test_text_windows(void) {
    char spec[700];
    const char *hello = path_in("hello.txt");
    write_text(hello, "hello world\n");
    mpt_dataset *tr, *te;
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=4)", hello);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &tr, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TEST, NO_SHAPE, &te, err, sizeof err) == 0, "%s", err);
    if (!tr || !te)
        return;
    mpt_shape ls = mpt_data_label_shape(tr), xs = mpt_data_sample_shape(tr);
    CHECK(mpt_data_count(tr) == 1 && mpt_data_count(te) == 1);
    CHECK(xs.rank == 1 && xs.dim[0] == 4 && ls.rank == 1 && ls.dim[0] == 4);
    CHECK(mpt_data_input_dtype(tr) == MPT_DT_I32 && mpt_data_label_dtype(tr) == MPT_DT_I32);
    CHECK(mpt_data_num_classes(tr) == 256);
    int32_t x[2 * 4], y[2 * 4];
    int64_t real;
    /* Batches of 2 over one window: the second row is padding, all 0. */
    read_tokens(tr, 0, 2, x, y, &real);
    static const int32_t zero[4];
    CHECK(real == 1 && ids_are(x, "hell", 4) && ids_are(y, "ello", 4));
    CHECK(!memcmp(x + 4, zero, sizeof zero) && !memcmp(y + 4, zero, sizeof zero));
    read_tokens(te, 0, 1, x, y, &real);
    CHECK(real == 1 && ids_are(x, "o wo", 4) && ids_are(y, " wor", 4));

    /* One-hot targets [B,T,256], and a target shaped for class ids. */
    int64_t xd[2] = {1, 4}, hd[3] = {1, 4, 256}, bd[1] = {1};
    mpt_tensor xt = tensor(MPT_DT_I32, 2, xd), hot = tensor(MPT_DT_F32, 3, hd);
    mpt_tensor bad = tensor(MPT_DT_I32, 1, bd);
    CHECK(mpt_data_batch(te, 0, 1, &xt, &hot, NULL, err, sizeof err) == 0);
    const float *h = hot.data;
    float sum = 0;
    for (int i = 0; i < 4 * 256; i++)
        sum += h[i];
    CHECK(sum == 4 && h[0 * 256 + ' '] == 1 && h[1 * 256 + 'w'] == 1 && h[3 * 256 + 'r'] == 1);
    CHECK(mpt_data_batch(te, 0, 1, &xt, &bad, NULL, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "labels are class ids in [0,256), 4 per sample: the model's target "
                     "must be i32 [1,4] or f32 [1,4,256], not i32 [1]"), "%s", err);
    CHECK_MSG(strstr(err, "hint: the model must predict a class at every position"), "%s", err);
    free(xt.data);
    free(hot.data);
    free(bad.data);

    /* Train and test share the corpus read at the first open: a file
     * changed while one is held is not read again. */
    mpt_dataset *again;
    write_text(hello, "HELLO WORLD\n");
    CHECK(mpt_data_open(spec, MPT_DATA_TEST, NO_SHAPE, &again, err, sizeof err) == 0);
    read_tokens(again, 0, 1, x, y, &real);
    CHECK(ids_are(x, "o wo", 4));
    mpt_data_free(again);
    mpt_data_free(tr);
    mpt_data_free(te);
    CHECK(mpt_data_open(spec, MPT_DATA_TEST, NO_SHAPE, &again, err, sizeof err) == 0);
    read_tokens(again, 0, 1, x, y, &real);
    CHECK(ids_are(x, "O WO", 4));
    mpt_data_free(again);
    write_text(hello, "hello world\n");

    /* seq_len from the model's input [T]; a different one is an error. */
    snprintf(spec, sizeof spec, "text(\"%s\")", hello);
    CHECK(mpt_data_open(spec, MPT_DATA_TRAIN, shape_of(1, (int64_t[]){4}), &again, err,
                        sizeof err) == 0);
    CHECK(again && mpt_data_sample_shape(again).dim[0] == 4);
    mpt_data_free(again);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "text: no seq_len", "hint: give one");
    expect_open_error(spec, MPT_DATA_TRAIN, shape_of(2, (int64_t[]){2, 2}),
                      "samples are [seq_len] byte ids, but the model's input is [2,2]", "hint:");
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=8)", hello);
    expect_open_error(spec, MPT_DATA_TRAIN, shape_of(1, (int64_t[]){4}),
                      "text: seq_len=8 but the model's input is [4]",
                      "hint: leave out seq_len=");
}

/* Windows of 2 + 1 bytes: he|el ll|lo o |_w wo|or, then rl|ld for testing. */
static void test_text_batches(void) {
    char spec[700];
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=2)", path_in("hello.txt"));
    mpt_dataset *d, *tr, *va;
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    if (!d)
        return;
    static const char *const xs[4] = {"he", "ll", "o ", "wo"}, *const ys[4] = {"el", "lo", " w", "or"};
    CHECK(mpt_data_count(d) == 4);
    /* Shuffled rows are the file-order windows at the permutation, x and
     * y together; the last of two batches of 3 has one real row. */
    int64_t order[4], real;
    mpt_data_permutation(4, 5, 1, order);
    mpt_data_shuffle(d, 5, 1);
    int32_t x[3 * 2], y[3 * 2];
    int pairs = 1;
    read_tokens(d, 0, 3, x, y, &real);
    for (int r = 0; r < 3; r++)
        pairs &= ids_are(x + 2 * r, xs[order[r]], 2) && ids_are(y + 2 * r, ys[order[r]], 2);
    CHECK(real == 3 && pairs);
    read_tokens(d, 1, 3, x, y, &real);
    CHECK(real == 1 && ids_are(x, xs[order[3]], 2) && ids_are(y, ys[order[3]], 2));
    int zeros = 1;
    for (int i = 2; i < 6; i++)
        zeros &= x[i] == 0 && y[i] == 0;
    CHECK(zeros);
    CHECK(mpt_data_num_batches(d, 3, MPT_DATA_DROP_REMAINDER) == 1);
    /* validation_split takes the last windows of the train part. */
    mpt_data_unshuffle(d);
    CHECK(mpt_data_split(d, 0.25, &tr, &va, err, sizeof err) == 0);
    CHECK(mpt_data_count(tr) == 3 && mpt_data_count(va) == 1);
    read_tokens(va, 0, 1, x, y, &real);
    CHECK(ids_are(x, "wo", 2) && ids_are(y, "or", 2));
    mpt_data_free(tr);
    mpt_data_free(va);
    mpt_data_free(d);
}

/* A folder: files in name order, subfolders where their names sort;
 * hidden files, binary files and a second link to a file left out. */
static void test_text_folder(void) {
    char dir[400], spec[700], p[600];
    snprintf(dir, sizeof dir, "%s/books", tmp);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/b.txt", dir);
    write_text(p, "world\n");
    snprintf(p, sizeof p, "%s/a.txt", dir);
    write_text(p, "hello ");
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=1)", dir);
    check_corpus(spec, "hello world\n");
    snprintf(p, sizeof p, "%s/c", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/c/d.txt", dir);
    write_text(p, "!!");
    snprintf(p, sizeof p, "%s/.hidden", dir);
    write_text(p, "secret");
    snprintf(p, sizeof p, "%s/a.dat", dir);
    write_bytes(p, "\0\0\0\2bin", 7, 0);
    snprintf(p, sizeof p, "%s/a.u8", dir);
    CHECK(symlink("a.txt", p) == 0);
    snprintf(p, sizeof p, "%s/c/loop", dir);
    CHECK(symlink("..", p) == 0);
    snprintf(p, sizeof p, "%s/dangling", dir);
    CHECK(symlink("nothing-here", p) == 0);
    check_corpus(spec, "hello world\n!!");

    /* A folder of binary files only says why it is empty. */
    snprintf(dir, sizeof dir, "%s/bin", tmp);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/x.dat", dir);
    write_bytes(p, "\0\1\2\3\4\5", 6, 0);
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=1)", dir);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "the text has 0 bytes (1 file holding NUL "
                      "bytes left out as binary), fewer than two windows", "hint:");
}

/* Root reads any file, so as root the check runs in a child that drops to
 * nobody. */
static void check_unreadable(const char *spec, const char *path) {
    chmod(path, 0);
    if (geteuid() != 0) {
        expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "Permission denied", "hint:");
        return;
    }
    chmod(tmp, 0711);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) || setuid(65534))
            _exit(2);
        mpt_dataset *d = NULL;
        int rc = mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err);
        int ok = rc == -1 && strstr(err, "Permission denied") && strstr(err, "hint:");
        if (!ok)
            fprintf(stderr, "unreadable %s: rc %d: %s\n", path, rc, err);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    chmod(tmp, 0700);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2)
        printf("note: cannot become nobody, the unreadable-file check is skipped\n");
    else
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
}

static void test_text_errors(void) {
    char spec[700], p[600];
    expect_open_error("text(\"/nonexistent/mptc.txt\", seq_len=4)", MPT_DATA_TRAIN, NO_SHAPE,
                      "/nonexistent/mptc.txt: no such file or folder",
                      "hint: give a text file or a folder of them; `apt-get install fortunes` "
                      "gives /usr/share/games/fortunes, a folder of English text");
    snprintf(p, sizeof p, "%s/empty.txt", tmp);
    write_text(p, "");
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=4)", p);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "the text has 0 bytes, fewer than two "
                      "windows of seq_len+1 = 5 bytes (9 needed)", "hint: give more text");
    write_text(p, "12345678");
    expect_open_error(spec, MPT_DATA_TEST, NO_SHAPE, "the text has 8 bytes, fewer than two "
                      "windows of seq_len+1", "hint:");
    write_text(p, "123456789");
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=4, test_fraction=0.6)", p);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "test_fraction=0.6 of 2 windows leaves an "
                      "empty train part", "hint:");
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=4)", p);
    check_unreadable(spec, p);

    snprintf(p, sizeof p, "%s/fifo", tmp);
    CHECK(mkfifo(p, 0644) == 0);
    snprintf(spec, sizeof spec, "text(\"%s\", seq_len=4)", p);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "fifo: is not a regular file", "hint:");
    snprintf(p, sizeof p, "%s/books/zz_fifo", tmp);
    CHECK(mkfifo(p, 0644) == 0);
    snprintf(spec, sizeof spec, "text(\"%s/books\", seq_len=4)", tmp);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "zz_fifo: is not a regular file",
                      "move it out of the folder");
}

/* The fortunes corpus: its text files (the .u8 names are links to them,
 * the .dat indexes binary) in name order. */
#define FORTUNES "/usr/share/games/fortunes"

static int64_t fortunes_bytes(void) {
    DIR *d = opendir(FORTUNES);
    struct dirent *e;
    int64_t total = 0;
    while (d && (e = readdir(d))) {
        char p[600];
        struct stat st;
        snprintf(p, sizeof p, FORTUNES "/%s", e->d_name);
        if (e->d_name[0] == '.' || lstat(p, &st) || !S_ISREG(st.st_mode))
            continue;
        FILE *f = fopen(p, "rb");
        int c, binary = 0;
        while (f && (c = getc(f)) != EOF)
            binary |= c == 0;
        if (f)
            fclose(f);
        total += binary ? 0 : st.st_size;
    }
    if (d)
        closedir(d);
    return total;
}

static void test_text_fortunes(void) {
    if (access(FORTUNES "/art", R_OK) != 0) {
        printf("note: %s missing (apt-get install fortunes), the fortunes checks are skipped\n",
               FORTUNES);
        return;
    }
    mpt_dataset *tr, *te;
    const char *spec = "text(\"" FORTUNES "\", seq_len=128)";
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &tr, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TEST, shape_of(1, (int64_t[]){128}), &te, err,
                            sizeof err) == 0, "%s", err);
    if (!tr || !te)
        return;
    int64_t windows = (fortunes_bytes() - 1) / 128;
    int64_t train = (int64_t)((double)windows * 0.9);
    CHECK_MSG(mpt_data_count(tr) == train && mpt_data_count(te) == windows - train,
              "%lld + %lld windows, want %lld of %lld", (long long)mpt_data_count(tr),
              (long long)mpt_data_count(te), (long long)train, (long long)windows);
    CHECK(windows > 10000);
    /* The first window is the start of "art", the first file by name. */
    enum { B = 512 };
    static int32_t x[B * 128], y[B * 128];
    char art[129] = "";
    FILE *f = fopen(FORTUNES "/art", "rb");
    CHECK(f && fread(art, 1, 128, f) == 128);
    if (f)
        fclose(f);
    int64_t real;
    read_tokens(tr, 0, B, x, y, &real);
    CHECK(ids_are(x, art, 128) && ids_are(y, art + 1, 127));
    mpt_dataset *parts[2] = {tr, te};
    int in_range = 1;
    for (int p = 0; p < 2; p++)
        for (int64_t b = 0; b < mpt_data_num_batches(parts[p], B, MPT_DATA_PAD_REMAINDER); b++) {
            read_tokens(parts[p], b, B, x, y, &real);
            for (int64_t i = 0; i < real * 128; i++)
                in_range &= x[i] > 0 && x[i] < 256 && y[i] > 0 && y[i] < 256;
        }
    CHECK_MSG(in_range, "an id outside [1,256): a NUL or a wrong byte");
    mpt_data_free(tr);
    mpt_data_free(te);
}

int main(void) {
    if (data_tmp_init()) return 1;
    test_text_windows();
    test_text_batches();
    test_text_folder();
    test_text_errors();
    test_text_fortunes();
    data_tmp_remove();
    return check_exit("test_data_text");
}
