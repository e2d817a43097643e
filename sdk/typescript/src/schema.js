// The typed schema DSL of dsh tools (semantics §6.2): a SchemaSpec is a record
// of properties `{type, required?, description?, enum?, default?, properties?,
// items?}`. specToJsonSchema converts it to the JSON Schema the model sees and
// validateArgs checks the model's arguments against it with the exact rules
// and messages of every dsh SDK:
//
//   - the top level must be a non-array object ("arguments" must be an object);
//   - declared keys in declaration order: absent → `missing required property
//     "<path>"` only when required (null counts as absent for an optional
//     property and is a type violation for a required one);
//   - type checks (`"<path>" must be a string|a number|an integer|a boolean|an
//     object|an array`); objects recurse into declared properties; arrays check
//     each item with path `p[i]`; then enum membership (`"<path>" must be one
//     of [a, b]`);
//   - extra keys are allowed and defaults are never applied.

const TYPES = new Set(['string', 'number', 'integer', 'boolean', 'object', 'array'])

/** @param {Record<string, any>} spec */
export function specToJsonSchema(spec) {
  checkSpec(spec, '')
  return objectSchema(spec)
}

function checkSpec(spec, prefix) {
  if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) {
    throw new TypeError(`parameters${prefix ? ' of ' + prefix : ''} must be a record of properties`)
  }
  for (const [name, prop] of Object.entries(spec)) {
    const path = prefix ? `${prefix}.${name}` : name
    checkProp(prop, path)
  }
}

function checkProp(prop, path) {
  if (prop === null || typeof prop !== 'object' || !TYPES.has(prop.type)) {
    throw new TypeError(`property "${path}" needs a type (one of ${[...TYPES].join(', ')})`)
  }
  if (prop.enum !== undefined && !Array.isArray(prop.enum)) throw new TypeError(`property "${path}": enum must be an array`)
  if (prop.properties !== undefined) {
    if (prop.type !== 'object') throw new TypeError(`property "${path}": properties need type object`)
    checkSpec(prop.properties, path)
  }
  if (prop.items !== undefined) {
    if (prop.type !== 'array') throw new TypeError(`property "${path}": items need type array`)
    checkProp(prop.items, `${path}[]`)
  }
}

function objectSchema(spec) {
  const properties = {}
  const required = []
  for (const [name, prop] of Object.entries(spec)) {
    properties[name] = propSchema(prop)
    if (prop.required === true) required.push(name)
  }
  const out = { type: 'object', properties }
  if (required.length > 0) out.required = required
  return out
}

function propSchema(prop) {
  const out = { type: prop.type }
  if (typeof prop.description === 'string' && prop.description !== '') out.description = prop.description
  if (prop.enum !== undefined) out.enum = [...prop.enum]
  if (prop.default !== undefined) out.default = prop.default
  if (prop.type === 'object' && prop.properties !== undefined) {
    const o = objectSchema(prop.properties)
    out.properties = o.properties
    if (o.required) out.required = o.required
  }
  if (prop.type === 'array' && prop.items !== undefined) out.items = propSchema(prop.items)
  return out
}

function article(t) {
  return /^[aeiou]/.test(t) ? 'an' : 'a'
}

function typeOk(type, v) {
  switch (type) {
    case 'string': return typeof v === 'string'
    case 'boolean': return typeof v === 'boolean'
    case 'number': return typeof v === 'number' && Number.isFinite(v)
    case 'integer': return typeof v === 'number' && Number.isInteger(v)
    case 'object': return v !== null && typeof v === 'object' && !Array.isArray(v)
    case 'array': return Array.isArray(v)
    default: return true
  }
}

/**
 * Validate arguments against a SchemaSpec. Total: never throws.
 * @returns {string[]} the violations (empty = valid)
 */
export function validateArgs(spec, args) {
  if (args === null || typeof args !== 'object' || Array.isArray(args)) return ['"arguments" must be an object']
  const out = []
  checkProps(spec, args, '', out)
  return out
}

function checkProps(spec, obj, prefix, out) {
  for (const [name, prop] of Object.entries(spec)) {
    const path = prefix ? `${prefix}.${name}` : name
    const present = Object.prototype.hasOwnProperty.call(obj, name) && obj[name] !== undefined
    if (!present || (obj[name] === null && prop.required !== true)) {
      if (prop.required === true) out.push(`missing required property "${path}"`)
      continue
    }
    checkValue(prop, obj[name], path, out)
  }
}

function checkValue(prop, v, path, out) {
  if (!typeOk(prop.type, v)) {
    out.push(`"${path}" must be ${article(prop.type)} ${prop.type}`)
    return
  }
  if (prop.type === 'object' && prop.properties !== undefined) checkProps(prop.properties, v, path, out)
  if (prop.type === 'array' && prop.items !== undefined) {
    v.forEach((item, i) => checkValue(prop.items, item, `${path}[${i}]`, out))
  }
  if (Array.isArray(prop.enum) && !prop.enum.some((e) => e === v)) {
    out.push(`"${path}" must be one of [${prop.enum.map((e) => (typeof e === 'string' ? e : JSON.stringify(e))).join(', ')}]`)
  }
}
