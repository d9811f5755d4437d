/*
 * no_entry — a test shared object without idemq_plugin_entry: idemq must refuse it at startup.
 */
int no_entry_marker(void);

int no_entry_marker(void)
{
    return 42;
}
