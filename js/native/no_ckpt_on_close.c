/*
 * A loadable SQLite extension with one job: switch off the checkpoint at
 * close (SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE) on the connection that loads
 * it. better-sqlite3 has no sqlite3_db_config; a connection whose WAL
 * generation is retired (deleted or replaced under it) must never be
 * closed with a checkpoint, which would write the retired frames into
 * whatever file is at the path now and then unlink the WAL by its path.
 * Loading fails unless the flag is on afterwards.
 */
#include "sqlite3ext.h"
SQLITE_EXTENSION_INIT1

#ifdef _WIN32
__declspec(dllexport)
#endif
int sqlite3_turnsafe_nockpt_init(sqlite3 *db, char **err, const sqlite3_api_routines *api) {
  SQLITE_EXTENSION_INIT2(api);
  int on = 0;
  int rc = sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, &on);
  if (rc != SQLITE_OK || on != 1) {
    *err = sqlite3_mprintf("SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE could not be switched on (rc %d, flag %d)", rc, on);
    return SQLITE_ERROR;
  }
  return SQLITE_OK;
}
