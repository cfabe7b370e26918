// Fresh ids (a message's uid, a lease token, an edit's id) and the seed of
// a flush machine's or an edit's retry jitter.
import { randomUUID } from 'node:crypto';

/** 32 hex digits, as the native host mints them. */
export const mintId = () => randomUUID().replaceAll('-', '');

/** A 32-bit seed for the policy's jitter. */
export const seed = () => Math.floor(Math.random() * 2 ** 32);
