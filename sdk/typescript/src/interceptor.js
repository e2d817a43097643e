// The ToolInterceptor side: a policy service that answers before a call
// (allow / deny / ask) and after it (accept / block). Subclass Interceptor
// (or pass any object with preExecute/postExecute) to serve({interceptor}).
// A method that throws answers INTERNAL; the agent then applies its own
// fail-open or fail-closed setting for this interceptor.

import * as grpc from '@grpc/grpc-js'
import { blockToProto } from './views.js'

export const allow = () => ({ allow: {} })
/** Refuse the call; the model sees `Error: <reason>`. */
export const deny = (reason) => ({ deny: { reason } })
export const ask = (reason = '') => ({ ask: { reason } })
/** Keep the outcome; `content` (when given) replaces the result's content. */
export const accept = (content, additionalContexts = []) =>
  content === undefined
    ? { accept: { replaceContent: false, content: [], additionalContexts } }
    : { accept: { replaceContent: true, content: content.map(blockToProto), additionalContexts } }
/** Turn the outcome into an error carrying `feedback`. */
export const block = (feedback, additionalContexts = []) => ({ block: { feedback: feedback.map(blockToProto), additionalContexts } })

/** Base class: the defaults allow and accept. */
export class Interceptor {
  async preExecute(_execution) {
    return undefined
  }

  async postExecute(_execution, _result) {
    return undefined
  }
}

export function interceptorService(impl) {
  const wrap = (fn) => async (call, cb) => {
    try {
      const decision = await fn(call.request)
      cb(null, decision ? { decision } : {})
    } catch (e) {
      cb({ code: grpc.status.INTERNAL, details: `interceptor failed: ${e instanceof Error ? e.message : String(e)}` })
    }
  }
  return {
    PreExecute: wrap((req) => impl.preExecute?.(req.execution)),
    PostExecute: wrap((req) => impl.postExecute?.(req.execution, req.result)),
  }
}
